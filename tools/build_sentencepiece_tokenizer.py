"""Build a small SentencePiece tokenizer offline (for the detokenization tests): BPE with byte fallback, trained on
`tools/corpus/tiny_corpus.txt`, saved as a transformers Llama tokenizer (Metaspace / ByteFallback decoders, the
word-initial-space scheme of Llama-2, Mistral, Gemma). One training thread and fixed settings: same bytes every run.

    python tools/build_sentencepiece_tokenizer.py OUT_DIR
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tools" / "corpus" / "tiny_corpus.txt"
VOCAB_SIZE = 600


def build(out: Path) -> Path:
    import sentencepiece as spm
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS.read_text(encoding="utf-8").splitlines()),
        model_writer=model,
        model_type="unigram",
        vocab_size=VOCAB_SIZE,
        byte_fallback=True,  # characters outside the vocabulary become <0xNN> byte pieces
        character_coverage=0.98,  # leaves the rarer characters to the byte fallback
        num_threads=1,
        split_digits=True,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        minloglevel=2,
    )
    (out / "tokenizer.model").write_bytes(model.getvalue())
    # The Llama-2 tokenizer.json pipeline, built from the pieces and scores (transformers' converter needs a
    # protobuf runtime that does not match the one installed here).
    processor = spm.SentencePieceProcessor(model_proto=model.getvalue())
    vocab = [(processor.id_to_piece(i), processor.get_score(i)) for i in range(processor.get_piece_size())]
    backend = Tokenizer(models.Unigram(vocab, unk_id=0, byte_fallback=True))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    backend.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>", add_bos_token=True
    )
    tokenizer.save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    build(parser.parse_args(argv).out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
