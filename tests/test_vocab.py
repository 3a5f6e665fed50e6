"""Vocabulary, shared tokenizer and length-bucketed batching."""
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, RandomSampler, SequentialSampler
from torch.utils.data.distributed import DistributedSampler

from zoo.data.sampling import BucketBatchSampler
from zoo.data.vocab import END_ID, PAD_ID, SPECIALS, START_ID, UNK_ID, Vocab, pad_captions, tokenize
from zoo.guards.errors import UserError


def test_tokenize_lowercases_and_strips_punctuation():
    assert tokenize("A Red shirt, LEFT of a blue bag.") == ["a", "red", "shirt", "left", "of", "a", "blue", "bag"]
    assert tokenize("  the man's 'hat' -- on!? ") == ["the", "man's", "hat", "on"]
    assert tokenize("t-shirt") == ["t", "shirt"]
    assert tokenize("...") == []
    # idempotent, so tokens from a file and raw strings agree
    text = "Two dogs; one (brown) & one white!"
    assert tokenize(" ".join(tokenize(text))) == tokenize(text)


def test_specials_have_fixed_ids():
    v = Vocab.build([["a", "b"]])
    assert v.itos[:4] == ["<pad>", "<start>", "<end>", "<unk>"]
    assert (PAD_ID, START_ID, END_ID, UNK_ID) == (0, 1, 2, 3) == tuple(v.stoi[w] for w in SPECIALS)


def test_build_counts_min_freq_max_size_and_order():
    captions = [["a", "dog", "runs"], ["a", "cat", "runs"], ["a", "dog"], ["zebra"]]
    v = Vocab.build(captions, min_freq=2)
    # most frequent first, ties alphabetical; words below min_freq are out
    assert v.itos[4:] == ["a", "dog", "runs"]
    assert "zebra" not in v and "cat" not in v
    assert Vocab.build(captions, min_freq=1, max_size=2).itos[4:] == ["a", "dog"]
    assert len(Vocab.build(captions)) == 4 + 5
    # independent of caption order
    assert Vocab.build(list(reversed(captions))) == Vocab.build(captions)
    # special tokens in the text are not duplicated
    assert Vocab.build([["<unk>", "a"]]).itos == list(SPECIALS) + ["a"]
    with pytest.raises(UserError):
        Vocab.build(captions, min_freq=0)


def test_encode_decode():
    v = Vocab.build([["a", "red", "shirt"], ["a", "bag"]])
    ids = v.encode(["a", "green", "shirt"])
    assert ids == [v.stoi["a"], UNK_ID, v.stoi["shirt"]]
    assert START_ID not in ids and END_ID not in ids
    assert v.encode_caption(["a", "red", "shirt"], max_len=2) == [START_ID, v.stoi["a"], v.stoi["red"], END_ID]
    # decode stops at <end> and drops the specials
    seq = [START_ID, v.stoi["a"], UNK_ID, v.stoi["bag"], END_ID, v.stoi["shirt"], PAD_ID]
    assert v.decode(seq) == ["a", "bag"]
    assert v.decode(torch.tensor(seq)) == ["a", "bag"]
    assert v.decode([v.stoi["a"], PAD_ID, v.stoi["red"]]) == ["a", "red"]
    assert v.decode(v.encode_caption(["a", "red", "shirt"])) == ["a", "red", "shirt"]


def test_vocab_from_a_word_list_round_trip_and_validation():
    v = Vocab.build([["x", "y", "y"]])
    w = Vocab(list(v.itos))
    assert w == v and w.stoi == v.stoi and len(w) == len(v)
    with pytest.raises(UserError, match="special tokens"):
        Vocab(["a", "b"])
    with pytest.raises(UserError, match="duplicate"):
        Vocab(list(SPECIALS) + ["a", "a"])


def test_pad_captions():
    captions, lengths = pad_captions([[1, 5, 2], [1, 2], [1, 6, 7, 8, 2]])
    assert captions.dtype == torch.long and lengths.tolist() == [3, 2, 5]
    assert captions.tolist() == [[1, 5, 2, 0, 0], [1, 2, 0, 0, 0], [1, 6, 7, 8, 2]]


# ----------------------------------------------------------------------------- bucketing
def _lengths(n=1000, seed=0):
    return np.random.default_rng(seed).integers(3, 30, size=n)


def test_bucket_sampler_yields_every_index_once_and_len_matches():
    lengths = _lengths(1003)
    for drop_last in (False, True):
        for pool_batches in (1, 3, 50):
            s = BucketBatchSampler(RandomSampler(range(1003), generator=torch.Generator().manual_seed(0)),
                                   lengths, batch_size=16, drop_last=drop_last, pool_batches=pool_batches)
            batches = list(s)
            assert len(batches) == len(s)
            flat = [i for b in batches for i in b]
            assert len(flat) == len(set(flat))
            if not drop_last:
                assert sorted(flat) == list(range(1003))
            assert all(len(b) == 16 for b in batches) or not drop_last


def test_bucket_sampler_groups_similar_lengths():
    lengths = _lengths(2048)
    # one pool over the whole epoch: batches are consecutive runs of the sorted lengths
    s = BucketBatchSampler(RandomSampler(range(2048)), lengths, batch_size=32, pool_batches=1000)
    batches = sorted(list(s), key=lambda b: (lengths[b].min(), lengths[b].max()))
    for a, b in zip(batches, batches[1:]):
        assert lengths[a].max() <= lengths[b].min()
    # default pools: far less padding than random batches
    s = BucketBatchSampler(RandomSampler(range(2048)), lengths, batch_size=32)
    bucket_pad = sum(lengths[b].max() * len(b) - lengths[b].sum() for b in s)
    order = np.random.default_rng(1).permutation(2048)
    random_pad = sum(lengths[order[i:i + 32]].max() * 32 - lengths[order[i:i + 32]].sum() for i in range(0, 2048, 32))
    assert bucket_pad < 0.2 * random_pad


def test_bucket_sampler_order_changes_per_epoch_and_is_reproducible():
    lengths = _lengths(500)

    def make():
        return BucketBatchSampler(RandomSampler(range(500), generator=torch.Generator().manual_seed(3)),
                                  lengths, batch_size=10, seed=3)

    a, b = make(), make()
    epoch0, epoch1 = list(a), list(a)
    assert epoch0 != epoch1
    assert list(b) == epoch0 and list(b) == epoch1


def test_bucket_sampler_shards_with_a_distributed_sampler():
    lengths = _lengths(400)
    shards = []
    for rank in range(2):
        dist = DistributedSampler(range(400), num_replicas=2, rank=rank, shuffle=True, seed=0)
        s = BucketBatchSampler(dist, lengths, batch_size=8)
        s.set_epoch(1)
        shards.append({i for b in s for i in b})
    assert not shards[0] & shards[1]
    assert shards[0] | shards[1] == set(range(400))


def test_lightning_can_inject_a_distributed_sampler():
    """Under DDP, Lightning re-creates the batch sampler with its DistributedSampler as `sampler`."""
    from lightning.fabric.utilities.data import _replace_dunder_methods
    from lightning.pytorch.utilities.data import _update_dataloader
    from torch.utils.data import BatchSampler

    data = list(range(100))
    lengths = _lengths(100)
    with _replace_dunder_methods(BatchSampler):  # as Lightning does around train_dataloader()
        loader = DataLoader(data, batch_sampler=BucketBatchSampler(SequentialSampler(data), lengths, 4),
                            collate_fn=lambda b: b)
    seen = []
    for rank in range(2):
        new = _update_dataloader(loader, DistributedSampler(data, num_replicas=2, rank=rank, shuffle=True))
        assert isinstance(new.batch_sampler, BucketBatchSampler)
        assert new.batch_sampler.lengths is not None and new.batch_sampler.batch_size == 4
        seen.append({i for b in new for i in b})
    assert not seen[0] & seen[1] and seen[0] | seen[1] == set(data)
