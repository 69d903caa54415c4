#!/usr/bin/env python3
"""Replays a raw allocator trace (tools/measure_train_memory.py's trace_NAME.bin.xz: the block
layout when recording began, then every alloc/free event) through a Python model of PyTorch's
CUDA caching allocator at its defaults -- the same rules as src/diag/alloc_sim.cpp -- and prints
the replayed peak reserved next to the one the run recorded. Checks the allocator model alone,
on the exact tensor sequence of a real run (docs/mem-plan.md, "Peak reserved").

Usage: tools/replay_allocator_trace.py tests/fixtures/train_memory/traces/trace_*.bin.xz
"""
import bisect, json, lzma, struct, sys
MiB = 1 << 20
kMinBlock = 512; kSmall = MiB; kSmallBuf = 2 * MiB; kLargeBuf = 20 * MiB; kMinLarge = 10 * MiB; kRoundLarge = 2 * MiB

def round_size(s):
    return kMinBlock if s < kMinBlock else kMinBlock * ((s + kMinBlock - 1) // kMinBlock)

def alloc_size(s):
    if s <= kSmall: return kSmallBuf
    if s < kMinLarge: return kLargeBuf
    return kRoundLarge * ((s + kRoundLarge - 1) // kRoundLarge)

class Block:
    __slots__ = ("addr", "size", "free", "prev", "next", "small")
    def __init__(s, addr, size, free, small):
        s.addr, s.size, s.free, s.small = addr, size, free, small
        s.prev = s.next = None

class Sim:
    def __init__(s):
        s.free = {True: [], False: []}  # small? -> sorted [(size, addr)]
        s.blocks = {}  # addr -> Block
        s.reserved = 0; s.allocated = 0; s.peak_res = 0; s.peak_alloc = 0; s.next_addr = 1 << 40
        s.seg_allocs = []
    def _ins(s, b): bisect.insort(s.free[b.small], (b.size, b.addr))
    def _del(s, b):
        L = s.free[b.small]; i = bisect.bisect_left(L, (b.size, b.addr)); assert L[i] == (b.size, b.addr); L.pop(i)
    def add_segment(s, size, small, blocks=None):
        addr = s.next_addr; s.next_addr += size + (1 << 30)
        s.reserved += size; s.peak_res = max(s.peak_res, s.reserved)
        specs = blocks or [(size, True)]
        prev = None; a = addr; out = []
        for sz, fr in specs:
            b = Block(a, sz, fr, small); b.prev = prev
            if prev: prev.next = b
            s.blocks[a] = b
            if fr: s._ins(b)
            else: s.allocated += sz
            prev = b; a += sz; out.append(b)
        return out
    def malloc(s, req):
        size = round_size(req); small = size <= kSmall
        L = s.free[small]; i = bisect.bisect_left(L, (size, 0))
        if i == len(L):
            seg = alloc_size(size); s.seg_allocs.append((seg, size))
            b = s.add_segment(seg, small)[0]
        else:
            b = s.blocks[L[i][1]]
        s._del(b)
        rem = b.size - size
        if (small and rem >= kMinBlock) or (not small and rem > kSmall):
            r = Block(b.addr + size, rem, True, small); r.prev = b; r.next = b.next
            if b.next: b.next.prev = r
            b.next = r; b.size = size; s.blocks[r.addr] = r; s._ins(r)
        b.free = False; s.allocated += b.size; s.peak_alloc = max(s.peak_alloc, s.allocated)
        return b
    def release(s, b):
        b.free = True; s.allocated -= b.size
        for nb in (b.prev, b.next):
            pass
        # merge with next
        n = b.next
        if n and n.free:
            s._del(n); b.size += n.size; b.next = n.next
            if n.next: n.next.prev = b
            del s.blocks[n.addr]
        p = b.prev
        if p and p.free:
            s._del(p); p.size += b.size; p.next = b.next
            if b.next: b.next.prev = p
            del s.blocks[b.addr]; b = p
        s._ins(b)

def load_trace(path):
    raw = lzma.decompress(open(path, 'rb').read()); i = raw.index(b'\n')
    head = json.loads(raw[:i]); body = raw[i + 1:]
    rec = struct.Struct('<BQQq')
    ev = [rec.unpack_from(body, k) for k in range(0, len(body), rec.size)]
    return head, ev

def replay(path):
    head, ev = load_trace(path)
    s = Sim(); live = {}
    for addr, size, stype, blocks in head['segments_at_start']:
        small = stype == 'small'
        bl = s.add_segment(size, small, [(b[1], b[2] == 'inactive') for b in blocks])
        for (baddr, bsz, st), b in zip(blocks, bl):
            if st != 'inactive': live[baddr] = b
    s.peak_res = s.reserved; res0 = s.reserved
    real_seg = 0
    for act, addr, size, t in ev:
        if act == 1:
            live[addr] = s.malloc(size)
        elif act == 3:
            b = live.pop(addr, None)
            if b is not None: s.release(b)
        elif act == 4:
            real_seg += size
    return res0, real_seg, s

if __name__ == '__main__':
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for n in sys.argv[1:]:
        res0, real_seg, s = replay(n)
        G = 2 ** 30
        print(f'{n.rsplit("/", 1)[-1]:36s} start {res0/G:7.2f}  real growth {real_seg/G:7.2f} -> {(res0+real_seg)/G:7.2f} | sim growth {(s.peak_res-res0)/G:7.2f} -> {s.peak_res/G:7.2f}  sim peak alloc {s.peak_alloc/G:7.2f}')
