#!/usr/bin/env python3
"""Where a process's threads wait, weighted by how long: reads `perf script` output of
sched:sched_switch events recorded with call stacks, and sums, per (kernel reason, first
frame of the program's own code), the time from each switch-out of a thread to its next
one. That is the time the thread spent switched out plus the run that followed: enough
to rank waits (a lock, the device, an idle queue) by what they cost the threads.

    perf record -e sched:sched_switch --call-graph dwarf,16384 -p PID -- sleep 5
    perf script | bench/offcpu.py [--top N] [--own PREFIX]

`--own` (default `oleo`) names the crates whose frames count as the program's own: the
first such frame from the leaf up, skipping locks, std and libc, says who waited.
"""

import argparse
import collections
import re
import sys

HEADER = re.compile(r"^\s*(\S+)\s+(\d+)(?:/(\d+))?\s+(?:\[\d+\]\s+)?([\d.]+):")
# Frames that say how a thread waits, not who waits.
PLUMBING = re.compile(
    r"(^std::|^core::|^alloc::|parking_lot|lock_api|::sync::|^__|syscall|futex|"
    r"\[unknown\]|pthread|sched_yield|::blocking::)")
# Kernel frames of the switch itself.
SWITCH = re.compile(r"^(schedule|__schedule|preempt_schedule|__traceiter|trace_|__pfx)")


def symbol(frame):
    """The function name of one `perf script` stack line."""
    f = re.sub(r"^\s*[0-9a-f]+\s+", "", frame.strip())
    f = re.sub(r"\s+\(.*\)$", "", f)
    f = re.sub(r"\+0x[0-9a-f]+$", "", f)
    return re.sub(r"<impl [^>]*>::", "", f)


def classify(stack, own):
    """(kernel reason, waiting frame) of one switch-out, its stack leaf first."""
    kernel = [s for s in stack if "[kernel" in s]
    user = [s for s in stack if "[kernel" not in s]
    reason = next((symbol(s) for s in kernel if not SWITCH.match(symbol(s))), "?")
    who = "?"
    for s in user:
        name = symbol(s)
        if any(name.startswith(p) for p in own) and not PLUMBING.search(name):
            who = name
            break
    return reason, who


def events(lines, own):
    """(thread, timestamp, (reason, who)) of every switch-out in `perf script` text."""
    out, stack, head = [], [], None
    for line in list(lines) + [""]:
        if not line.strip():
            if head:
                out.append((head[0], head[1], classify(stack, own)))
            stack, head = [], None
        elif line[0] in " \t":
            stack.append(line)
        else:
            m = HEADER.match(line)
            if m:
                head = (m.group(3) or m.group(2), float(m.group(4)))
    return out


def weigh(evs):
    """Seconds per (reason, who): each switch-out until its thread's next one."""
    by_thread = collections.defaultdict(list)
    for tid, ts, why in evs:
        by_thread[tid].append((ts, why))
    spent = collections.Counter()
    for seq in by_thread.values():
        seq.sort()
        for (a, why), (b, _) in zip(seq, seq[1:]):
            spent[why] += b - a
    return spent


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--own", action="append", default=None)
    a = ap.parse_args()
    own = a.own or ["oleo"]
    spent = weigh(events(sys.stdin, own))
    total = sum(spent.values()) or 1.0
    for (reason, who), s in spent.most_common(a.top):
        print(f"{100 * s / total:5.1f}% {s:8.3f}s  {reason:30s} {who}")


if __name__ == "__main__":
    main()
