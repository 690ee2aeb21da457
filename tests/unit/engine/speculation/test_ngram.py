"""Prompt lookup: what follows the latest earlier occurrence of the sequence's last n-gram."""

from __future__ import annotations

from infer.engine.speculation.ngram import NgramProposer


def test_ngram_proposes_what_followed_the_latest_longest_match() -> None:
    draft = NgramProposer(min_n=1, max_n=3)
    #            0  1  2  3  4  5  6  7  8  9
    tokens = [1, 2, 3, 4, 5, 9, 2, 3, 7, 1, 2, 3]
    # suffix [1, 2, 3] occurred at 0..2, followed by 4, 5, 9
    assert draft.propose(tokens, 3) == [4, 5, 9]
    assert draft.propose(tokens, 1) == [4]
    # no 3-gram match: the 2-gram [2, 3] latest at 6..7, followed by 7, 1, ...
    assert draft.propose([2, 3, 7, 1, 8, 2, 3], 2) == [7, 1]


def test_ngram_without_a_match_proposes_nothing() -> None:
    draft = NgramProposer(min_n=2, max_n=4)
    assert draft.propose([1, 2, 3, 4, 5], 4) == []
    assert draft.propose([7], 4) == []
    assert draft.propose([1, 2, 1, 2], 0) == []


def test_ngram_matches_whole_tokens_only() -> None:
    # 256 and 1 share bytes with a misaligned window of [1, 256]: only a whole-token match counts
    draft = NgramProposer(min_n=2, max_n=2)
    tokens = [1, 256, 65536, 8, 1, 256]
    assert draft.propose(tokens, 2) == [65536, 8]
    assert draft.propose([0x01000000, 0, 1, 5, 0, 1], 1) == [5]


def test_ngram_looks_only_inside_its_window() -> None:
    draft = NgramProposer(min_n=2, max_n=2, window_tokens=5)
    assert draft.propose([1, 2, 3, 9, 9, 9, 9, 1, 2], 2) == []
    assert NgramProposer(min_n=2, max_n=2).propose([1, 2, 3, 9, 9, 9, 9, 1, 2], 2) == [3, 9]


def test_drafts_run_to_the_end_of_the_sequence_at_most() -> None:
    assert NgramProposer(min_n=1, max_n=1).propose([5, 6, 5], 4) == [6, 5]
