"""Speculative decoding, in one package: drafts proposed for decoding requests, verified in the next step.

- `proposer.py`: the `Proposer` interface (a sequence's likely next tokens); `ngram.py`: `NgramProposer`,
  prompt lookup. A draft model is one more class in its own module.
- `speculator.py`: `Speculator`, who drafts and how many (a request's cap, a pause at low acceptance);
  `state.py`: a request's `SpecState` and the bounds (a leaf).
- `verifier.py`: `Verifier`, a step's sampling rows (a request's newest token and each of its drafts) and,
  from the ids the runner sampled on the device, the drafts accepted, counted, and a seeded generator
  rewound.

The core asks the speculator for drafts and passes them to the scheduler, which schedules them as far as its
token budget and free blocks allow and rolls back the KV of the rejected ones; nothing here reads or writes
the scheduler's tables.

NOTE: no names imported here: the settings and the request import `state.py`, a leaf, without the rest.
"""
