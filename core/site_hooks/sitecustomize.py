"""Run at start-up of Python processes that vLLM starts from ours (see core/torchvision_free.py)."""

try:
    from core.torchvision_free import install

    install()
except ImportError:  # the project is not importable in this process: nothing to do
    pass
