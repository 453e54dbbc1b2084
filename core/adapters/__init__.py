"""The Triton Python-backend adapters, one module per model kind; the rendered model.py files import them
through core/triton_models.py. Only these modules import `triton_python_backend_utils`."""
