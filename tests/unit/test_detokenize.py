"""Detokenization in postprocess (postprocess/detokenize.py) against vLLM's own detokenizer, without Triton.

Property tests over random token-id sequences of two tokenizers, a byte-level BPE one (the default model's) and a
SentencePiece one with byte fallback (tools/build_sentencepiece_tokenizer.py), cut into deltas at random
boundaries: the core computes each delta's window from ids only (core/token_windows.py), postprocess decodes it,
and every delta must equal what vLLM 0.32's FastIncrementalDetokenizer emits for the same delta.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.interface import ENGINE_RESPONSE, document_tensor
from core.protocol import EngineResponse, SequenceDelta, TokenLogprob, encode_response, merge_responses
from core.token_sync import REPLACEMENT, sync_token_ids
from core.token_windows import TokenWindows
from postprocess.detokenize import Detokenizer, NoDetokenizer, detokenize
from postprocess.vllm_backend import VllmBackendPostprocessor
from tools.build_sentencepiece_tokenizer import build as build_sentencepiece

# Text with multi-byte characters (2-, 3- and 4-byte UTF-8), some outside the tokenizers' vocabularies.
ALPHABET = "ab xyz.,\n'éüßøЖж你好世界😀🚀ﬁ\u00a0"


class Case:
    def __init__(self, path: str) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.detokenizer = Detokenizer(self.tokenizer)
        self.sync_ids = sync_token_ids(self.tokenizer)
        self.vocab = len(self.tokenizer)


@pytest.fixture(scope="module")
def cases(tiny_model, tmp_path_factory) -> dict[str, Case]:
    spm_dir = build_sentencepiece(tmp_path_factory.mktemp("spm"))
    return {"byte_level": Case(str(tiny_model)), "sentencepiece": Case(str(spm_dir))}


def _vllm_detokenizer(case: Case, prompt: list[int], options: dict[str, bool]):
    from vllm.v1.engine.detokenizer import FastIncrementalDetokenizer

    params = SimpleNamespace(stop=None, min_tokens=0, **options)
    request = SimpleNamespace(request_id="test", prompt_token_ids=list(prompt), sampling_params=params)
    return FastIncrementalDetokenizer(case.tokenizer, request)


def _vllm_logprob_tokens(case: Case, positions: list[list[int]]) -> list[list[str]]:
    """vLLM's LogprobsProcessor decoding of sampled-logprob entries (sampled token first at each position)."""
    from vllm.tokenizers.detokenizer_utils import convert_ids_list_to_tokens
    from vllm.v1.engine.logprobs import LogprobsProcessor

    processor = LogprobsProcessor(case.tokenizer, [], None, 0.0, 2, None)
    result = []
    for ids in positions:
        context = processor._get_sampled_context_ids(processor.logprobs)
        decoded = processor._verify_tokens(convert_ids_list_to_tokens(case.tokenizer, ids), ids, context)
        processor.logprobs.append({tid: None for tid in ids})
        result.append(decoded)
    return result


@st.composite
def token_ids(draw, case: Case, min_size: int, max_size: int) -> list[int]:
    """Either uniformly random ids (broken UTF-8, special tokens, ...) or the encoding of random text."""
    if draw(st.booleans()):
        return draw(st.lists(st.integers(0, case.vocab - 1), min_size=min_size, max_size=max_size))
    text = draw(st.text(alphabet=ALPHABET, min_size=min_size, max_size=max_size))
    ids = case.tokenizer.encode(text, add_special_tokens=False)[:max_size]
    return ids if len(ids) >= min_size else ids + [case.vocab - 1] * (min_size - len(ids))


def _cuts(draw, length: int) -> list[int]:
    points = sorted(set(draw(st.lists(st.integers(1, max(1, length - 1)), max_size=length))))
    bounds = [0, *[p for p in points if 0 < p < length], length]
    return [b - a for a, b in zip(bounds, bounds[1:], strict=False) if b > a] or [0]


def _deltas(case, prompt, output, sizes, finish, logprobs, decode):
    windows = TokenWindows(prompt, case.sync_ids, logprobs is not None)
    responses, start = [], 0
    for k, size in enumerate(sizes):
        chunk = output[start : start + size]
        last = k == len(sizes) - 1
        context, num_prompt = windows.next_window(0, chunk)
        positions = None
        if logprobs is not None:
            positions = [{str(t): TokenLogprob(-0.5, 1) for t in logprobs[i]} for i in range(start, start + size)]
        delta = SequenceDelta(0, "", chunk, finish if last else None, None, None, positions, context, num_prompt)
        responses.append(EngineResponse([delta], len(prompt), last, {}, decode=dict(decode)))
        start += size
    return responses


@pytest.mark.parametrize("name", ["byte_level", "sentencepiece"])
def test_sync_tables_are_most_of_the_vocabulary(cases, name):
    case = cases[name]
    assert case.sync_ids is not None
    assert 0.5 * case.vocab < len(case.sync_ids) < case.vocab
    added = set(case.tokenizer.get_added_vocab().values())
    assert not added & case.sync_ids


@pytest.mark.parametrize("name", ["byte_level", "sentencepiece"])
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_deltas_equal_vllm_detokenizer(cases, name, data):
    case = cases[name]
    prompt = data.draw(token_ids(case, 1, 12), "prompt")
    output = data.draw(token_ids(case, 0, 40), "output")
    sizes = _cuts(data.draw, len(output))
    decode = {
        "skip_special_tokens": data.draw(st.booleans(), "skip_special_tokens"),
        "spaces_between_special_tokens": data.draw(st.booleans(), "spaces_between_special_tokens"),
        "include_stop_str_in_output": data.draw(st.booleans(), "include_stop_str_in_output"),
    }
    finish = data.draw(st.sampled_from(["length", "stop"]), "finish") if output else "length"
    reference = _vllm_detokenizer(case, prompt, decode)

    ours, theirs, start = [], [], 0
    for response in _deltas(case, prompt, output, sizes, finish, None, decode):
        seq = response.outputs[0]
        reference.update(seq.token_ids, response.finished and finish == "stop")
        theirs.append(reference.get_next_output_text(response.finished, delta=True))
        ours.append(detokenize(response, case.detokenizer).outputs[0].text)
        assert response.decode is None and seq.context_ids is None  # decoded once: a second call is a no-op
        start += len(seq.token_ids)
    assert ours == theirs  # delta by delta, not only joined
    assert "".join(ours) == reference.output_text

    # Stateless: each delta decodes on its own, in any order (another instance, a retry, ...).
    shuffled = _deltas(case, prompt, output, sizes, finish, None, decode)[::-1]
    assert [detokenize(r, case.detokenizer).outputs[0].text for r in shuffled] == ours[::-1]

    # The plain path: the same deltas merged into one response decode to the same text.
    merged = merge_responses(_deltas(case, prompt, output, sizes, finish, None, decode))
    assert detokenize(merged, case.detokenizer).outputs[0].text == "".join(ours)


@pytest.mark.parametrize("name", ["byte_level", "sentencepiece"])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_text_deltas_join_to_the_decoded_text_without_broken_characters(cases, name, data):
    """For ids of real text: the joined deltas are the tokenizer's decode, and no delta has a U+FFFD."""
    case = cases[name]
    prompt_text = data.draw(st.text(alphabet=ALPHABET, min_size=1, max_size=15), "prompt")
    output_text = data.draw(st.text(alphabet=ALPHABET, min_size=1, max_size=30), "output")
    prompt = case.tokenizer.encode(prompt_text, add_special_tokens=False) or [case.vocab - 1]
    output = case.tokenizer.encode(output_text, add_special_tokens=False)
    sizes = _cuts(data.draw, len(output))
    decode = {"skip_special_tokens": True, "spaces_between_special_tokens": True, "include_stop_str_in_output": False}
    texts = [
        detokenize(r, case.detokenizer).outputs[0].text
        for r in _deltas(case, prompt, output, sizes, "length", None, decode)
    ]
    whole = case.tokenizer.decode(prompt + output, skip_special_tokens=True)
    prefix = case.tokenizer.decode(prompt, skip_special_tokens=True)
    assert whole.startswith(prefix)
    assert "".join(texts) == whole[len(prefix) :]
    assert not any(REPLACEMENT in t for t in texts)


@pytest.mark.parametrize("name", ["byte_level", "sentencepiece"])
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_logprob_decoded_tokens_equal_vllm(cases, name, data):
    case = cases[name]
    prompt = data.draw(token_ids(case, 1, 6), "prompt")
    output = data.draw(token_ids(case, 1, 24), "output")
    ids = st.integers(0, case.vocab - 1)
    positions = [[t, *data.draw(st.lists(ids, max_size=2, unique=True), "alternatives")] for t in output]
    sizes = _cuts(data.draw, len(output))
    decode = {"skip_special_tokens": True, "spaces_between_special_tokens": True, "include_stop_str_in_output": False}
    ours = []
    for response in _deltas(case, prompt, output, sizes, "length", positions, decode):
        for position in detokenize(response, case.detokenizer).outputs[0].logprobs:
            ours.append([entry.decoded_token for entry in position.values()])
    # a dict keeps one entry per id: compare on the distinct ids, as vLLM's dict does
    expected = [
        [text for _, text in dict(zip(p, texts, strict=True)).items()]
        for p, texts in zip(positions, _vllm_logprob_tokens(case, positions), strict=True)
    ]
    assert ours == expected


def test_prompt_logprobs_use_the_previous_prompt_tokens_as_context(cases):
    case = cases["byte_level"]
    prompt = case.tokenizer.encode("你好世界 Grüße", add_special_tokens=False)
    positions = [None] + [{str(t): TokenLogprob(-1.0, 1)} for t in prompt[1:]]
    response = EngineResponse(
        [], len(prompt), True, {}, decode={"skip_special_tokens": True}, prompt_logprobs=positions
    )
    detokenize(response, case.detokenizer)
    expected = _vllm_logprob_tokens(case, [[t] for t in prompt[1:]])
    decoded = [None if p is None else [e.decoded_token for e in p.values()] for p in response.prompt_logprobs]
    assert decoded == [None, *expected]


def test_windows_stay_small_for_real_text(cases):
    case = cases["byte_level"]
    text = "Grüße aus München, 你好世界! " * 20
    output = case.tokenizer.encode(text, add_special_tokens=False)
    windows = TokenWindows([5, 6, 7], case.sync_ids, logprobs=False)
    longest = max(len(windows.next_window(0, [t])[0]) for t in output)
    assert longest <= 4


def test_unsupported_decoders_keep_vllms_detokenizer():
    """A decoder this module does not reproduce (here WordPiece) gets no sync table: the engine keeps decoding."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1, "##b": 2}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.decoder = decoders.WordPiece()
    assert sync_token_ids(PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")) is None


def test_a_stage_without_a_tokenizer_passes_decoded_text_and_refuses_ids_to_decode():
    """Its detokenizer is the null object: text the engine decoded goes through, ids to decode are an error."""
    stage = VllmBackendPostprocessor({})
    assert isinstance(stage.detokenizer, NoDetokenizer)

    def run(response: EngineResponse) -> dict[str, np.ndarray]:
        return stage.process({ENGINE_RESPONSE.name: document_tensor(ENGINE_RESPONSE, encode_response(response))}, {})

    decoded = EngineResponse([SequenceDelta(0, "hello", [5, 6], "stop")], 3, True, {})
    assert run(decoded)["text_output"].tolist() == [b"hello"]
    ids_only = EngineResponse([SequenceDelta(0, "", [5, 6], "stop", context_ids=[1])], 3, True, {}, decode={})
    with pytest.raises(RuntimeError, match="no 'tokenizer' setting"):
        run(ids_only)
