"""How samples/text/tokenizer.json was made: a byte-level BPE of 512 tokens trained offline (the `tokenizers`
package) on this repository's README.md, with `<|endoftext|>` as its one special token. Run from the repository's
root to make it again: `python3 samples/text/train_tokenizer.py` (the same input gives the same file)."""
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train([str(ROOT / "README.md")], trainer)
    tok.save(str(Path(__file__).with_name("tokenizer.json")))


if __name__ == "__main__":
    main()
