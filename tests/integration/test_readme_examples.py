"""The README's "Ask it" examples, run as written against the session server (only the ports differ)."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from repo_render import ROOT

pytestmark = pytest.mark.server


def _ask_it_blocks(language: str) -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Ask it", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{language}\n(.*?)```", section, re.S)


def _curl_commands() -> list[str]:
    commands = []
    for block in _ask_it_blocks("bash"):
        # one command per paragraph of the block; comment lines name it
        for chunk in re.split(r"\n\s*\n", block):
            lines = [line for line in chunk.splitlines() if not line.lstrip().startswith("#")]
            if lines:
                commands.append("\n".join(lines))
    return commands


def test_the_readme_shows_every_way_in():
    text = "\n".join(_curl_commands())
    for way in ("/generate ", "/generate_stream", "/infer", '"messages"'):
        assert way in text, way
    python = "\n".join(_ask_it_blocks("python"))
    assert "client.infer(" in python and "async_stream_infer(" in python


@pytest.mark.parametrize("index", range(4))
def test_each_curl_example_answers(server, index: int):
    command = _curl_commands()[index].replace("localhost:8000", server.http_url)
    done = subprocess.run(
        ["bash", "-c", command + " --fail-with-body -sS"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, (command, done.stdout, done.stderr)
    if "generate_stream" in command:
        events = [json.loads(line[len("data: ") :]) for line in done.stdout.splitlines() if line.startswith("data: ")]
        assert len(events) >= 2 and "".join(e["text_output"] for e in events)
    elif "/infer" in command:
        outputs = {o["name"]: o["data"] for o in json.loads(done.stdout)["outputs"]}
        assert outputs["text_output"][0]
    else:
        assert json.loads(done.stdout)["text_output"]


def test_the_python_example_answers_plain_and_streamed(server, capsys):
    (code,) = _ask_it_blocks("python")
    exec(compile(code.replace("localhost:8001", server.grpc_url), "README.md", "exec"), {})  # noqa: S102
    printed = capsys.readouterr().out
    assert printed.count("\n") >= 1 and len(printed.strip()) > 10
