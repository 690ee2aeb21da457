"""The KV-cache events replay socket (engine/kv_events.py), served in bounded turns so a burst never delays live events.

vLLM's protocol on a ROUTER socket: a request [b"", seq] (8 bytes, big-endian) is answered with
[b"", topic, seq, payload] for the batches held from seq on, then the end marker [b"", b"", -1 (8 bytes), b""].
The publisher thread alternates live batches and replay turns; the bounds:

- per answer: at most REPLAY_ANSWER_BATCHES batches and REPLAY_ANSWER_BYTES of payload (one batch at least), then
  the end marker; a subscriber that needs more asks again from the batch after the last it got;
- per burst: at most REPLAY_ACTIVE answers accepted and not yet ended; a request beyond them is refused: the end
  marker alone, counted (`num_refused`): the subscriber sees an answer without the batches it knows exist, and
  asks later. At most REPLAY_REFUSALS refusals wait to be sent; beyond them requests are not read (they wait in
  ZMQ's queues, and a sender whose queue is full waits: nothing is lost);
- per turn: at most REPLAY_TURN_MESSAGES requests read and as many messages sent (batches, end markers,
  refusals), a message for each subscriber in turn, then the thread goes back to the live batches; and at most
  REPLAY_MESSAGES_PER_S messages in a second.

A subscriber's answers go out whole and in the order it asked (a second request waits for the first answer's end
marker), so a DEALER that asks twice reads two answers, never one woven into the other.

Every request read gets its end marker: a send never blocks and never drops (ROUTER_MANDATORY), and what the
subscriber's queue cannot take yet is sent on a later turn. A subscriber that takes nothing for REPLAY_STALL_S,
or leaves, has what it is owed cut (answers counted as refused); their slots go to the next requests.
"""

from __future__ import annotations

import bisect
import itertools
import time
from collections import OrderedDict, deque
from dataclasses import dataclass

import zmq

END_SEQ = (-1).to_bytes(8, "big", signed=True)
REPLAY_BATCHES = 10_000  # recent batches the replay socket can send again (vLLM's buffer_steps)
REPLAY_ANSWER_BATCHES = 1_000  # batches in one answer at most
REPLAY_ANSWER_BYTES = 16 << 20  # payload bytes in one answer at most (one batch whatever its size)
REPLAY_ACTIVE = 32  # answers accepted and not yet ended; a request beyond them is refused
REPLAY_REFUSALS = 1_024  # refusals waiting to be sent at most; beyond them requests wait unread
REPLAY_TURN_MESSAGES = 64  # requests read, and messages sent, in one turn of the publisher thread
REPLAY_MESSAGES_PER_S = 10_000  # replay messages sent in a second at most (the bucket holds a second's worth)
REPLAY_SEND_HWM = 1_000  # messages ZMQ queues for one replay subscriber (ZMQ's default); a full queue waits
REPLAY_STALL_S = 10.0  # an answer whose subscriber takes nothing for this long is cut
REPLAY_POLL_S = 0.05  # how often an idle publisher thread looks for requests
REPLAY_BLOCKED_S = 0.005  # how soon it tries again when every subscriber's queue is full


@dataclass
class Answer:
    """One request's answer: the batches still to send, then the end marker (alone: a refusal)."""

    batches: deque[tuple[int, bytes]]
    since: float  # when the subscriber last took a message of it (or when it reached the head of its queue)
    is_refusal: bool = False
    is_done: bool = False  # the end marker went out


class Replays:
    """The ring of recent batches and the answers owed to each subscriber; used by the publisher thread alone."""

    def __init__(self, socket: zmq.Socket[bytes], topic: bytes) -> None:
        """`socket`: a ROUTER not yet bound (a bound socket's listener keeps the options it had)."""
        socket.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a full or gone peer raises rather than drops in silence
        socket.setsockopt(zmq.SNDHWM, REPLAY_SEND_HWM)
        self.socket, self.topic = socket, topic
        self.num_refused = 0  # requests refused (all slots busy) and answers cut (the subscriber stalled or left)
        self.ring: deque[tuple[int, bytes]] = deque(maxlen=REPLAY_BATCHES)
        self.owed: OrderedDict[bytes, deque[Answer]] = OrderedDict()  # identity -> its answers, in the order asked
        self.num_active = self.num_refusals = 0  # answers and refusals owed
        self._tokens, self._refilled_at = float(REPLAY_MESSAGES_PER_S), time.monotonic()

    def hold(self, seq: int, payload: bytes) -> None:
        self.ring.append((seq, payload))

    def turn(self) -> float:
        """Serve one turn: new requests, then a message for each subscriber in turn, within the turn's and the
        second's budget; the seconds until the next turn is due (0: more to do now)."""
        now = time.monotonic()
        budget = min(REPLAY_TURN_MESSAGES, self._refill(now))
        num_read = self._take_requests(budget, now)
        sent = self._send_owed(budget, now)
        self._tokens -= sent
        if budget in (sent, num_read):  # more to do: now, or once the bucket allows
            return max(0.0, (1 - self._tokens) / REPLAY_MESSAGES_PER_S)
        return REPLAY_BLOCKED_S if self.owed else REPLAY_POLL_S

    def _refill(self, now: float) -> int:
        """The token bucket: REPLAY_MESSAGES_PER_S a second, a second's worth at most; the whole messages held."""
        rate = REPLAY_MESSAGES_PER_S
        self._tokens = min(float(rate), self._tokens + (now - self._refilled_at) * rate)
        self._refilled_at = now
        return int(self._tokens)

    def _take_requests(self, budget: int, now: float) -> int:
        """Read up to `budget` requests while refusals have room: each is accepted or refused; how many."""
        num_read = 0
        while num_read < budget and self.num_refusals < REPLAY_REFUSALS:
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            num_read += 1
            identity, request = frames[0], frames[1:]
            if self.num_active < REPLAY_ACTIVE:
                answer, self.num_active = Answer(self._held_from(request), now), self.num_active + 1
            else:
                answer, self.num_refusals = Answer(deque(), now, is_refusal=True), self.num_refusals + 1
                self.num_refused += 1
            self.owed.setdefault(identity, deque()).append(answer)
        return num_read

    def _send_owed(self, budget: int, now: float) -> int:
        """Send up to `budget` messages, one for each subscriber in turn; how many went out."""
        sent = num_waiting = 0
        while sent < budget and num_waiting < len(self.owed):
            identity, answers = next(iter(self.owed.items()))
            answer = answers[0]
            try:
                is_sent = self._send_next(identity, answer)
            except zmq.ZMQError:  # EHOSTUNREACH: it left
                self._drop(identity)
                continue
            if not is_sent and now - answer.since > REPLAY_STALL_S:
                self._drop(identity)
                continue
            if is_sent:
                sent, num_waiting, answer.since = sent + 1, 0, now
            else:
                num_waiting += 1
            if answer.is_done:
                self._end(answers.popleft())
                if answers:
                    answers[0].since = now
            if answers:
                self.owed.move_to_end(identity)
            else:
                del self.owed[identity]
        return sent

    def _send_next(self, identity: bytes, answer: Answer) -> bool:
        """The answer's next batch, or its end marker; False when the subscriber's queue is full (it is gone: raises
        ZMQError)."""
        if answer.batches:
            seq, payload = answer.batches[0]
            frames = [identity, b"", self.topic, seq.to_bytes(8, "big"), payload]
        else:
            frames = [identity, b"", b"", END_SEQ, b""]
        try:
            self.socket.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:  # its queue is full: a later turn
            return False
        if answer.batches:
            answer.batches.popleft()
        else:
            answer.is_done = True
        return True

    def _end(self, answer: Answer) -> None:
        if answer.is_refusal:
            self.num_refusals -= 1
        else:
            self.num_active -= 1

    def _drop(self, identity: bytes) -> None:
        """A subscriber that left, or took nothing for REPLAY_STALL_S: what it is owed is cut (answers counted)."""
        for answer in self.owed.pop(identity):
            self._end(answer)
            self.num_refused += not answer.is_refusal  # a refusal is counted once

    def _held_from(self, request: list[bytes]) -> deque[tuple[int, bytes]]:
        """The batches held from the request's seq on, within an answer's bounds; none for a malformed request. A
        seq no longer held gets the oldest held (its number says what was lost)."""
        if len(request) != 2 or request[0] != b"" or len(request[1]) != 8:
            return deque()
        start = bisect.bisect_left(self.ring, int.from_bytes(request[1], "big"), key=lambda held: held[0])
        batches: deque[tuple[int, bytes]] = deque()
        num_bytes = 0
        for seq, payload in itertools.islice(self.ring, start, start + REPLAY_ANSWER_BATCHES):
            num_bytes += len(payload)
            if batches and num_bytes > REPLAY_ANSWER_BYTES:
                break
            batches.append((seq, payload))
        return batches
