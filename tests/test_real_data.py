"""Tests for zfbench.real.data: synthetic stream, byte tokenizer, text windows and their split, errors."""

import itertools

import numpy as np
import pytest
import torch

from zfbench.real.data import (
    BYTE_VOCAB,
    ByteTokenizer,
    bigram_table,
    default_text,
    made_ahead,
    split_tokens,
    synthetic_batches,
    text_batches,
)


def take(it, n):
    return list(itertools.islice(it, n))


def same_stream(a, b):
    return all(torch.equal(x["input_ids"], y["input_ids"]) and torch.equal(x["labels"], y["labels"])
               for x, y in zip(a, b))


# ----------------------------------------------------------------------------- synthetic
def test_synthetic_same_seed_same_stream_different_seed_different():
    a = take(synthetic_batches(256, 4, 32, seed=7), 3)
    b = take(synthetic_batches(256, 4, 32, seed=7), 3)
    c = take(synthetic_batches(256, 4, 32, seed=8), 3)
    assert same_stream(a, b)
    assert not torch.equal(a[0]["input_ids"], c[0]["input_ids"])
    assert not torch.equal(a[0]["input_ids"], a[1]["input_ids"])  # the stream moves on


@pytest.mark.parametrize("count,cap_batches", [(0, 99), (5, 99), (12, 4), (30, 1)])
def test_made_ahead_is_the_same_stream_made_early(count, cap_batches):
    """The batches are those of the stream itself, in order, whatever was made ahead; at
    most `count` of them and no more bytes than the cap are made before the first is
    handed out."""
    calls = []

    def counted(stream):
        for batch in stream:
            calls.append(1)
            yield batch
    nbytes = 2 * 3 * 16 * 8  # input_ids and labels, 3 x 16 int64
    ahead = made_ahead(counted(synthetic_batches(50, 3, 16, seed=7)), count,
                       max_bytes=cap_batches * nbytes)
    assert len(calls) == max(1, min(count, cap_batches))
    assert same_stream(take(ahead, 20), take(synthetic_batches(50, 3, 16, seed=7), 20))


def test_synthetic_batch_layout_and_shift():
    batch = next(synthetic_batches(100, 3, 17, seed=0))
    ids, labels = batch["input_ids"], batch["labels"]
    assert ids.shape == labels.shape == (3, 17)
    assert ids.dtype == labels.dtype == torch.int64
    assert torch.equal(labels[:, :-1], ids[:, 1:])
    assert ids.min() >= 0 and max(ids.max(), labels.max()) < 100


def test_synthetic_transitions_follow_the_table_and_are_learnable():
    nxt, probs = bigram_table(256)
    batch = next(synthetic_batches(256, 16, 256, seed=1))
    ids, labels = batch["input_ids"].numpy(), batch["labels"].numpy()
    allowed = (nxt[ids] == labels[..., None]).any(-1)
    assert allowed.all()
    # The most likely successor (prob 128/255) is taken about half the time.
    first = (nxt[ids, 0] == labels).mean()
    assert 0.44 < first < 0.56
    # Conditional entropy of the language is far below uniform noise.
    entropy = -(probs * np.log(probs)).sum()
    assert entropy < 0.3 * np.log(256)


def test_synthetic_table_seed_changes_the_language_not_seed():
    a, b = bigram_table(64, table_seed=0)[0], bigram_table(64, table_seed=1)[0]
    assert not np.array_equal(a, b)
    assert np.array_equal(a, bigram_table(64, table_seed=0)[0])
    x = next(synthetic_batches(64, 4, 32, seed=3, table_seed=1))
    assert (b[x["input_ids"].numpy()] == x["labels"].numpy()[..., None]).any(-1).all()


def test_synthetic_large_vocab_is_fast_enough_and_in_range():
    batch = next(synthetic_batches(151936, 2, 256, seed=0))
    assert batch["input_ids"].max() < 151936


@pytest.mark.parametrize("bad", [dict(vocab=0), dict(batch=-1), dict(seq=0), dict(seq=2.5)])
def test_synthetic_rejects_bad_sizes(bad):
    args = dict(vocab=10, batch=2, seq=4, seed=0) | bad
    with pytest.raises(ValueError):
        synthetic_batches(**args)  # refused at call time, before any batch


# ----------------------------------------------------------------------------- tokenizer
@pytest.mark.parametrize(
    "text", ["", "hello", "héllo wörld", "日本語 \U0001F600\n\t\x00", "\ud800 lone surrogate"]
)
def test_byte_tokenizer_round_trip(text):
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert all(0 <= i < BYTE_VOCAB for i in ids)
    assert len(ids) == len(text.encode("utf-8", errors="surrogatepass"))
    assert tok.decode(ids) == text


def test_byte_tokenizer_round_trips_the_default_text_and_specials():
    tok = ByteTokenizer(["<bos>", "<eos>"])
    assert tok.vocab_size == 258 and tok.token_id("<eos>") == 257
    text = default_text()[:5000]
    ids = [tok.token_id("<bos>")] + tok.encode(text) + [tok.token_id("<eos>")]
    assert tok.decode(ids) == "<bos>" + text + "<eos>"
    assert tok.decode(ids, skip_special=True) == text
    with pytest.raises(ValueError, match="258"):
        tok.decode([258])
    with pytest.raises(KeyError):
        tok.token_id("<pad>")


def test_decode_of_invalid_utf8_replaces_instead_of_failing():
    assert ByteTokenizer().decode([104, 0xFF, 105]) == "h\ufffdi"


# ----------------------------------------------------------------------------- text
def test_default_text_is_pydoc_topics_in_sorted_order():
    from pydoc_data import topics

    text = default_text()
    first = sorted(topics.topics)[0]
    assert text.startswith(topics.topics[first])
    assert len(text) > 100_000


def test_text_split_is_by_position_and_windows_stay_in_their_part():
    # Train part only 'a'/'b'; held-out part (last 10%) only digits.
    text = "ab" * 450 + "0123456789" * 10
    train = take(text_batches(text, 8, 16, seed=0, split="train"), 20)
    held = take(text_batches(text, 8, 16, seed=0, split="heldout"), 20)
    train_bytes = set(torch.cat([b["input_ids"] for b in train] + [b["labels"] for b in train]).flatten().tolist())
    held_bytes = set(torch.cat([b["input_ids"] for b in held] + [b["labels"] for b in held]).flatten().tolist())
    assert train_bytes == {ord("a"), ord("b")}
    assert held_bytes <= set(b"0123456789") and len(held_bytes) == 10
    for b in train[:3] + held[:3]:
        assert torch.equal(b["labels"][:, :-1], b["input_ids"][:, 1:])
        assert b["input_ids"].shape == (8, 16)
    tokens = np.frombuffer(text.encode(), dtype=np.uint8)
    assert len(split_tokens(tokens, "heldout", 0.1)) == 100
    assert len(split_tokens(tokens, "train", 0.1)) == 900


def test_text_windows_deterministic_per_seed_and_file_equals_string(tmp_path):
    text = default_text()[:20_000]
    path = tmp_path / "corpus.txt"
    path.write_text(text, encoding="utf-8")
    a = take(text_batches(text, 4, 64, seed=1), 3)
    b = take(text_batches(path, 4, 64, seed=1), 3)
    c = take(text_batches(str(path), 4, 64, seed=1), 3)
    d = take(text_batches(text, 4, 64, seed=2), 3)
    assert same_stream(a, b) and same_stream(a, c)
    assert not torch.equal(a[0]["input_ids"], d[0]["input_ids"])
    raw = text.encode()
    for row in a[0]["input_ids"]:
        assert bytes(row.tolist()) in raw[: len(raw) - round(len(raw) * 0.1)]


def test_text_vocab_larger_is_fine_smaller_is_refused():
    next(text_batches(default_text(), 2, 8, seed=0, vocab=151936))
    with pytest.raises(ValueError, match=r"100.*256"):
        next(text_batches(default_text(), 2, 8, seed=0, vocab=100))


def test_text_missing_file_names_the_path(tmp_path):
    missing = tmp_path / "nope.txt"
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        text_batches(missing, 2, 8, seed=0)  # refused at call time
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        next(text_batches(str(missing), 2, 8, seed=0))


def test_text_too_short_names_path_and_needed_length(tmp_path):
    path = tmp_path / "short.txt"
    path.write_text("x" * 50)
    with pytest.raises(ValueError, match=r"short\.txt.*seq \+ 1 = 65"):
        next(text_batches(path, 2, 64, seed=0))
    # Long enough overall, but the held-out 10% (5 bytes) is not.
    with pytest.raises(ValueError, match=r"'heldout'.*= 9"):
        next(text_batches(path, 2, 8, seed=0, split="heldout"))
    next(text_batches(path, 2, 8, seed=0, split="train"))


def test_text_bad_split_and_fraction_are_refused():
    with pytest.raises(ValueError, match="split"):
        next(text_batches(default_text(), 2, 8, seed=0, split="test"))
    with pytest.raises(ValueError, match="heldout_fraction"):
        next(text_batches(default_text(), 2, 8, seed=0, heldout_fraction=1.0))
