"""How the ranks of a torchrun/srun job agree with each other, with timeouts that name who is missing.

A collective on the default group cannot time out for one peer, cannot say which peer is missing, and a
rank stuck inside one cannot take part in anything else. So the ranks agree through the job's TCPStore
instead: at each numbered *exchange* every rank posts a record and polls a counter. A rank that does not
arrive in time (or whose heartbeat stops) is named, asked for its Python stack, and the whole job ends:
once a rank was left inside a collective, the process group cannot be trusted again.

Only non-blocking store calls are used (set, add, check, get of present keys): a timed-out ``wait`` logs
C++ warnings on every poll. Values are chunked because the libuv store refuses values over 8 MiB.
Plain Python, no pytest.
"""
from __future__ import annotations

import os
import pickle
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .lost import CpuTrail, Stderr, evidence_blob, main_thread_stack, read_evidence_blob

CHUNK = 4 << 20
POLL_MAX_S = 0.05
HEARTBEAT_S = 1.0
DEAD_S = 15.0  # a rank whose heartbeat has not moved for this long is taken for dead
STACK_WAIT_S = 3.0  # how long a lost rank gets to post its stack
FINAL_WAIT_S = 30.0  # how long a rank that is done waits for the reporting rank before it exits
EXIT_AFTER_ABORT_S = 60.0  # a rank still running this long after the job was aborted ends itself
SELF_HANG_GRACE_S = 5.0  # past its own deadline, a rank stuck in dist.run ends itself (all peers stuck)

@dataclass
class Post:
    """What one rank posts at one exchange: where it is (``tag``), whether it is fine, and its data."""

    rank: int
    tag: str
    ok: bool = True
    data: Any = None


@dataclass(eq=False)
class WorldBroken(Exception):
    """The job cannot go on: ranks were lost (hung, dead) or are out of step. Every rank ends."""

    reason: str
    lost: Tuple[int, ...] = ()
    posts: Dict[int, Post] = field(default_factory=dict)  # what the ranks that did arrive posted
    stacks: Dict[int, str] = field(default_factory=dict)  # Python stacks of lost ranks, when they sent one
    evidence: Dict[int, Any] = field(default_factory=dict)  # what they said of themselves (lost.py)
    by_peer: bool = False  # another rank aborted the job; this one only learned of it

    def __post_init__(self):
        super().__init__(self.reason)

    def __str__(self) -> str:
        return self.reason


class ControlPlane:
    """Numbered exchanges through the job's store, abort and heartbeats. One per process and job."""

    def __init__(self, store, rank: int, world_size: int, say=None, stack_wait_s: float = STACK_WAIT_S):
        self._store = store
        self.stack_wait_s = stack_wait_s
        self.rank = rank
        self.world_size = world_size
        self._n = 0
        self.broken: Optional[str] = None
        self.lost: Tuple[int, ...] = ()
        self._say = say or Stderr()
        self._cpu = CpuTrail()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._deadline: Optional[Tuple[float, str]] = None  # (time.monotonic(), what) of the current call

    # -- exchanges ----------------------------------------------------------------------------
    def exchange(
        self,
        tag: str,
        data: Any = None,
        ok: bool = True,
        timeout_s: float = 300.0,
        deadline: Optional[float] = None,
        grace_s: Optional[float] = None,
    ) -> Dict[int, Post]:
        """Post ``(tag, ok, data)`` and return every rank's post once all have posted at this exchange.

        ``deadline`` (time.monotonic()) or ``timeout_s`` bound the wait; ``grace_s``: once a rank posted
        ``ok=False``, the missing ones get only this long. Raises WorldBroken naming the missing ranks.
        """
        if self.broken:
            raise WorldBroken(self.broken, self.lost, by_peer=True)
        self._n += 1
        n, me, world = self._n, self.rank, self.world_size
        try:
            self._put(f"x{n}/{me}", Post(me, tag, ok, data))
            self._store.add(f"x{n}/count", 1)
        except RuntimeError as exc:
            raise self._broke(f"rank {me} lost contact with the job's store ({exc})") from None
        start = time.monotonic()
        end = deadline if deadline is not None else start + timeout_s
        pending = set(range(world)) - {me}
        posts: Dict[int, Post] = {}
        first_failure: Optional[float] = None if ok else start
        beats: Dict[int, Tuple[int, float]] = {}
        last_seen = -1
        sleep = 0.0005
        next_slow = start + 0.25
        while True:
            try:
                count = int(self._store.add(f"x{n}/count", 0))
                now = time.monotonic()
                if count != last_seen and (grace_s is not None or count >= world):
                    last_seen = count
                    if self._read_arrived(n, pending, posts) and first_failure is None:
                        first_failure = now
                if not pending:
                    break
                if now >= next_slow:  # a few times a second: abort by a peer, dead peers
                    next_slow = now + 0.25
                    self._check_peers(pending, beats, now, tag, posts)
            except RuntimeError as exc:
                if isinstance(exc, WorldBroken):
                    raise
                raise self._broke(f"rank {me} lost contact with the job's store ({exc})", posts) from None
            limit = end if first_failure is None or grace_s is None else min(end, first_failure + grace_s)
            if now >= limit:
                try:  # who did arrive (posts are only read once all are there, or to spot failures)
                    self._read_arrived(n, pending, posts)
                except RuntimeError:
                    pass
                if not pending:
                    continue
                grace = None if first_failure is None or grace_s is None else (first_failure, limit)
                raise self._late(tuple(sorted(pending)), tag, posts, end - start, grace)
            time.sleep(min(sleep, max(0.0, limit - now)))
            sleep = min(sleep * 2, POLL_MAX_S)
        posts[me] = Post(me, tag, ok, data)
        self._cleanup(n - 1)
        return posts

    def _read_arrived(self, n: int, pending: set, posts: Dict[int, "Post"]) -> bool:
        """Move the ranks of ``pending`` that have posted at exchange ``n`` into ``posts``; True when
        one of them posted a failure."""
        failed = False
        for r in sorted(pending):
            if self._store.check([f"x{n}/{r}"]):
                posts[r] = self._get(f"x{n}/{r}")
                pending.discard(r)
                failed = failed or not posts[r].ok
        return failed

    def _late(self, missing: Tuple[int, ...], tag: str, posts: Dict[int, "Post"], waited_s: float,
              grace: Optional[Tuple[float, float]]) -> "WorldBroken":
        """The error for ranks that did not post in time: after a peer's failure (``grace``: when it
        came, and the limit it set), they are probably waiting in a collective for it."""
        if grace is not None:
            failed = _names(sorted(r for r, p in posts.items() if not p.ok) or [self.rank])
            why = (f"rank(s) {_names(missing)} still busy {_secs(grace[1] - grace[0])} after rank(s) "
                   f"{failed} failed at {tag} (probably waiting in a collective for them)")
        else:
            why = f"rank(s) {_names(missing)} did not arrive at {tag} within {_secs(waited_s)}"
        return self._lose(missing, why, posts)

    def _check_peers(self, pending: set, beats: Dict[int, Tuple[int, float]], now: float, tag: str,
                     posts: Dict[int, "Post"]) -> None:
        """Raise when a peer aborted the job, or a rank we wait for stopped sending heartbeats."""
        if self._store.check(["abort"]):
            reason = self._store.get("abort").decode(errors="replace")
            lost = tuple(r for r in range(self.world_size) if self._store.check([f"lost/{r}"]))
            self.broken, self.lost = reason, lost
            raise WorldBroken(reason, lost, posts, by_peer=True)
        dead = self._dead(pending, beats, now)
        if dead:
            raise self._lose(dead, f"rank(s) {_names(dead)} stopped sending heartbeats for {DEAD_S:g}s "
                             f"(the process died or froze) at {tag}", posts)

    def _put(self, key: str, post: Post) -> None:
        blob = pickle.dumps(post, protocol=pickle.HIGHEST_PROTOCOL)
        parts = [blob[i:i + CHUNK] for i in range(0, len(blob), CHUNK)] or [b""]
        for i, part in enumerate(parts):
            self._store.set(f"{key}/{i}", part)
        self._store.set(key, str(len(parts)))  # last: its presence means the chunks are there

    def _get(self, key: str) -> Post:
        parts = int(self._store.get(key))
        return pickle.loads(b"".join(self._store.multi_get([f"{key}/{i}" for i in range(parts)])))

    def _cleanup(self, n: int) -> None:
        """Everyone posted at exchange n+1, so everyone has read exchange n: drop this rank's keys."""
        if n < 1:
            return
        key = f"x{n}/{self.rank}"
        try:
            parts = int(self._store.get(key))
            for i in range(parts):
                self._store.delete_key(f"{key}/{i}")
            self._store.delete_key(key)
            if self.rank == 0:
                self._store.delete_key(f"x{n}/count")
        except RuntimeError:
            pass

    def _dead(self, pending, beats, now) -> List[int]:
        dead = []
        for r in pending:
            value = int(self._store.add(f"hb/{r}", 0))
            seen = beats.get(r)
            if seen is None or seen[0] != value:
                beats[r] = (value, now)
            elif now - seen[1] > DEAD_S:
                dead.append(r)
        return sorted(dead)

    # -- aborting -----------------------------------------------------------------------------
    def abort(self, reason: str, lost: Sequence[int] = (), store=None) -> None:
        """End the job: name the lost ranks (their monitors post a stack and exit), tell everyone why."""
        store = store or self._store
        self.broken = self.broken or reason
        self.lost = tuple(sorted(set(self.lost) | set(lost)))
        try:
            for r in lost:
                store.set(f"lost/{r}", "1")
            if int(store.add("abort/count", 1)) == 1:  # the first reason is the one everyone sees
                store.set("abort", reason)
        except RuntimeError:
            pass

    def _lose(self, lost: Sequence[int], reason: str, posts: Dict[int, Post]) -> WorldBroken:
        self.abort(reason, lost)
        stacks = self.stacks(lost, self.stack_wait_s)
        evidence = {r: e for r in stacks if (e := self._evidence(r)) is not None}
        return WorldBroken(reason, tuple(lost), posts, stacks, evidence)

    def _evidence(self, r: int):
        """What lost rank ``r`` said of itself (posted before its stack), or None."""
        try:
            if self._store.check([f"evidence/{r}"]):
                return read_evidence_blob(self._store.get(f"evidence/{r}"))
        except RuntimeError:
            pass
        return None

    def _broke(self, reason: str, posts: Optional[Dict[int, Post]] = None) -> WorldBroken:
        self.broken = self.broken or reason
        return WorldBroken(reason, (), posts or {})

    def stacks(self, ranks: Sequence[int], wait_s: float = STACK_WAIT_S) -> Dict[int, str]:
        """The stacks that lost ranks posted (their monitor thread does it on abort)."""
        got: Dict[int, str] = {}
        end = time.monotonic() + wait_s
        while True:
            for r in ranks:
                try:
                    if r not in got and self._store.check([f"stack/{r}"]):
                        got[r] = self._store.get(f"stack/{r}").decode(errors="replace")
                except RuntimeError:
                    return got
            if len(got) == len(ranks) or time.monotonic() >= end:
                return got
            time.sleep(0.05)

    def reporter(self) -> int:
        """The rank that prints the report: 0, or the lowest rank still alive when 0 was lost."""
        alive = [r for r in range(self.world_size) if r not in self.lost]
        return alive[0] if alive else 0

    # -- session end --------------------------------------------------------------------------
    def finish(self, timeout_s: float) -> None:
        """Normal end: every rank has finished (rank 0 has printed), then leave together, the store's
        host last (under srun rank 0 hosts it)."""
        self.exchange("the end of the session", timeout_s=timeout_s)
        self.stop_monitor()
        self._store.add("left", 1)
        if self.rank == 0:
            end = time.monotonic() + 5.0
            while int(self._store.add("left", 0)) < self.world_size and time.monotonic() < end:
                time.sleep(0.01)

    def final(self) -> None:
        """The reporting rank is done printing: ranks waiting to exit may go."""
        try:
            self._store.set("final", "1")
        except RuntimeError:
            pass

    def wait_final(self, wait_s: float = FINAL_WAIT_S) -> None:
        end = time.monotonic() + wait_s
        while time.monotonic() < end:
            try:
                if self._store.check(["final"]):
                    return
            except RuntimeError:
                return
            time.sleep(0.05)

    # -- the monitor thread -------------------------------------------------------------------
    def watch_deadline(self, deadline: Optional[float], what: str = "") -> None:
        """While the user's function runs: if this rank is still inside it well past the deadline,
        every rank is stuck (no peer is waiting to notice), so it ends itself."""
        self._deadline = (deadline, what) if deadline is not None else None

    def start_monitor(self) -> None:
        """Heartbeats, and the end of this process when the job is aborted and it cannot act itself."""
        store = self._store.clone()  # a store object per thread
        self._thread = threading.Thread(target=self._monitor, args=(store,), name="mgpu-monitor", daemon=True)
        self._thread.start()

    def stop_monitor(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
            self._thread = None

    def _monitor(self, store) -> None:
        me = self.rank
        aborted_at: Optional[float] = None
        errors_since: Optional[float] = None
        next_beat = 0.0
        while not self._stop.wait(0.25):
            now = time.monotonic()
            self._cpu.tick()
            try:
                if now >= next_beat:
                    store.add(f"hb/{me}", 1)
                    next_beat = now + HEARTBEAT_S
                errors_since = None
                if aborted_at is None and store.check(["abort"]):
                    aborted_at = now
                if aborted_at is not None and store.check([f"lost/{me}"]):
                    reason = store.get("abort").decode(errors="replace")
                    return self._end_self(store, f"the job was aborted: {reason}")
            except RuntimeError as exc:
                errors_since = errors_since or now
                if now - errors_since > DEAD_S:
                    return self._end_self(None, f"lost contact with the job's store for {DEAD_S:g}s ({exc})")
                continue
            if aborted_at is not None and now - aborted_at > EXIT_AFTER_ABORT_S:
                return self._end_self(store, f"still running {EXIT_AFTER_ABORT_S:g}s after the job was aborted")
            dl = self._deadline
            if dl is not None and now > dl[0] + SELF_HANG_GRACE_S:
                reason = f"rank {me} is still inside {dl[1]} {SELF_HANG_GRACE_S:g}s past its timeout (hung)"
                self.abort(reason, [me], store=store)
                return self._end_self(store, reason)

    def _end_self(self, store, reason: str) -> None:
        """Post this rank's stack, say why on its own stderr, wait for the report, and exit."""
        stack = main_thread_stack()
        if store is not None:
            try:
                store.set(f"evidence/{self.rank}", evidence_blob(self._cpu))  # before the stack: read after it
                store.set(f"stack/{self.rank}", stack)
                lost = [r for r in range(self.world_size) if store.check([f"lost/{r}"])]
                self.lost = tuple(sorted(set(self.lost) | set(lost) | {self.rank}))
            except RuntimeError:
                store = None
        self._say(f"[mgpu rank {self.rank}] ending this rank: {reason}\n"
                  f"[mgpu rank {self.rank}] its Python stack:\n{stack}\n")
        if store is not None and self.reporter() != self.rank:
            end = time.monotonic() + FINAL_WAIT_S
            while time.monotonic() < end:
                try:
                    if store.check(["final"]):
                        break
                except RuntimeError:
                    break
                time.sleep(0.05)
        os._exit(1)


def _secs(s: float) -> str:
    return f"{s:.0f}s" if s >= 1.5 else f"{s:.2g}s"


def _names(ranks) -> str:
    return ", ".join(map(str, ranks))
