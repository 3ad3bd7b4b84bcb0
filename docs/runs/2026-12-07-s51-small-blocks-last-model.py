#!/usr/bin/env python3
# The drawn schedule of one fused forward at V4-Pro per rank (48 experts, top-6, 132 CTAs), as perf.md
# v117 models it: each expert's blocks (ExpertBlocks: BN 256, overhang 16), an L1 pair item 2 x
# (0.44 + 0.56 rows / 256) x 60 us, an L2 tile the same x 25.7 us, each CTA's L1 -> L2 gap the
# epilogue of its last tile (35 us x rows / 256 x 1.3 + 1); items in launch order or small blocks
# last (the L1 only: lpt; both layers: lpt2). Prints the forward's end / the median gap / CTAs
# whose last L1 item is small, for five routings a T.
import random, heapq, statistics
def blocks(rows, BN=256, oh=16):
    count=(rows+BN-1)//BN; wide=0
    if oh>0 and rows>BN:
        fewest=(rows+BN+oh-1)//(BN+oh)
        if fewest<count: wide=(rows-fewest*BN)//oh; count=fewest
    out=[]
    start=0
    for m in range(count):
        r = (BN+oh if m<wide else BN) if m+1<count else rows-start
        out.append(r); start+=r
    return out
def tile(rows, full): return full*(0.44+0.56*rows/256)
def run(T, order, seed, E=48, K=6, C=132):
    rng=random.Random(seed); cnt=[0]*E
    for t in range(T):
        for e in rng.sample(range(E),K): cnt[e]+=1
    L1=[];L2=[]
    for e in range(E):
        bl=blocks(cnt[e])
        for n in range(24):
            for m,r in enumerate(bl): L1.append((e,n,m,r))
        for n in range(56):
            for m,r in enumerate(bl): L2.append((e,n,m,r))
    if order.startswith("lpt"):
        key=lambda it: (it[3] <= 128,)  # whole blocks first, stable
        L1=sorted(L1,key=key)
        if order=="lpt2": L2=sorted(L2,key=key)
    # dynamic draw
    heap=[(0.0,c) for c in range(C)]; heapq.heapify(heap)
    last={}
    for it in L1:
        t,c=heapq.heappop(heap); d=2*tile(it[3],60.0); heapq.heappush(heap,(t+d,c)); last[c]=it[3]
    ends=[]
    for t,c in heap: ends.append((t+35.0*last.get(c,0)/256*1.3+1,c))
    heap=ends; heapq.heapify(heap)
    gaps=[35.0*last.get(c,0)/256*1.3+1 for c in range(C)]
    for it in L2:
        t,c=heapq.heappop(heap); heapq.heappush(heap,(t+tile(it[3],25.7),c))
    return max(t for t,c in heap), statistics.median(gaps), sum(1 for r in last.values() if r<=128)
for T in (1000,2048,4096):
  for order in ("launch","lpt","lpt2"):
    res=[run(T,order,s) for s in range(5)]
    print(T,order,[f"{r[0]:.0f}/{r[1]:.1f}/{r[2]}" for r in res])
