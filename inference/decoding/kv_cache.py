"""The fast path's KV cache: pages of keys and values that sequences take as they grow, and a prefix cache of
pages already computed, so a conversation's next turn (or another chat with the same system prompt) reads
only what is new.

Memory follows the tokens in use, not the longest context times the most sequences: a sequence holds
``ceil(length / page)`` pages of 64 tokens, freed when it ends, and the pool grows (by an eighth) only when no
page is free; a sequence that grows takes another page, never a copy of what it holds. One layout on every
device: the pool is ``[layers, pages, kv_heads, page, head_dim]`` and each sequence has a page table, read by
Redline's native attention kernel on a CPU and by ``kernels/paged_torch.py`` (torch's operators: a GPU, a CPU
without the native kernels), so the prefix cache, many conversations kept at once and the pages on disk work
the same everywhere. (Until 2026-12 a GPU kept one page per sequence as long as its context, so that a decode
step had static shapes: the step read the longest sequence's whole slot and the prefix cache kept one idle
slot; two conversations taking turns re-read their history every turn.)

**The prefix cache.** With small pages, a full page is addressed by its content: a hash of its token ids
chained with the previous page's (so equal prefixes have equal keys, and a page is only ever reused after the
same tokens at the same positions). When a sequence ends, its full pages are registered under their keys;
a new sequence walks its prompt's pages and takes every one already there (counted by the sequences that
use it: a shared page is never written, never freed while in use), then reads only the rest. Unused cached
pages stay, least recently used first out: evicted when a page is needed and the cache holds its limit
(``cache_pages``) or the pool its budget (``budget_pages``). A page of a sequence that failed and an evicted
page are simply recomputed.

**Part of a page.** A conversation's next turn repeats the last one's tokens and then differs inside a page:
its last, partial page (the reply's end, the new question), or a full page where an edited or regenerated
message starts. Whole pages alone made the turn read again up to 63 tokens it had already computed (on the
starter a turn of 14 new tokens read 20 to 33). So a sequence's last partial page is kept too (a *tail*: not
addressed by a key, since its content is not a whole page, but listed under the key of the page before it, as
every registered page is), and after the walk of whole pages a prompt looks at the pages listed under the last
key it matched for the one whose tokens start like its own: the longest match is copied into a page of its own
(the sequence then writes after it; the cached page stays as it was) and the sequence starts there, as llama.cpp
reuses the longest common prefix of its slot. A tail that a later page holds and goes on from (the next turn's) is
dropped as that page is registered.

The cache also outlives the process: ``disk`` (``disk_pages.py``) takes a page as it is
evicted and every registered page on ``persist`` (the model unloads, Redline quits), and a prompt's walk that
passes the pages in memory goes on with the files on disk, each checked before it is copied into a fresh page.

**8 bits** (``form="q8"``, ``--kv q8``): the pools are int8 ``[layers, pages, kv_heads, page, head_dim + 2]``, each
token's row of a head its int8 values and their fp16 scale (``kernels/kv_quant.py``, the kernels'
``paged_attention.h``): written quantised by the step that computes the keys, read by attention as they are, about
half the bytes of bf16. Pages, the prefix cache and the disk pages hold that form unchanged.

The key of a pool is its model's: one pool belongs to one loaded model at one precision and KV dtype (the
decoder's), and ``namespace`` (the model's content, precision and KV dtype) starts every chain, so keys from
another model never match.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Optional, Sequence

import torch

from ..kernels import kv_quant
from ..memory.policy import weights_in_own_mappings
from .disk_pages import DiskPages, page_key

PAGE_TOKENS = 64


def chain_keys(namespace: bytes, tokens: Sequence[int], page: int, pages: int) -> list[bytes]:
    """The content keys of the first ``pages`` full pages of ``tokens``: each the hash of the page's token ids
    chained with the previous key (the first with ``namespace``); ``disk_pages.page_key`` is one link."""
    keys, prev = [], namespace
    for i in range(pages):
        prev = page_key(prev, tokens[i * page : (i + 1) * page])
        keys.append(prev)
    return keys


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    """How many tokens ``a`` and ``b`` share from their start."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class PagedKV:
    paged = True  # every pool is paged (one layout on every device); kept for readers that still ask

    def __init__(
        self,
        layers: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device,
        tokens: int = 256,
        cleared: bool = False,
        form: str = "bf16",
    ):
        self.layers, self.kv_heads, self.head_dim = layers, kv_heads, head_dim
        # ``form`` q8: 8-bit rows (int8, a scale each) whatever ``dtype`` (the model's) would have been.
        self.form = kv_quant.check_form(form)
        if form == "q8":
            dtype = torch.int8
        self.row = kv_quant.row_width(head_dim, form)  # the pool's last dimension
        self.dtype, self.device = dtype, torch.device(device)
        # Whether pages are allocated cleared (see ``_allocate``): always off a CPU, and where asked (a CPU step
        # on torch's operators, whose graphed attention reads past a sequence's length behind a mask).
        self.cleared = cleared or self.device.type != "cpu"
        self.page = PAGE_TOKENS
        pages = max(1, -(-tokens // self.page))
        self.k = self.v = None
        self.high_water = 0  # pages below this were handed out (written); those above never were
        self._allocate(pages)
        self.free = list(range(pages))
        self.tables: dict[int, list[int]] = {}
        # The prefix cache (see the module's docstring).
        self.namespace = b""
        self.cache_pages = 0  # unused cached pages kept at most (0: no prefix cache)
        self.budget_pages: Optional[int] = None  # the pool's size beyond which a page is evicted rather than grown
        self.refs: dict[int, int] = {}  # page → sequences using it
        self.key_of: dict[int, bytes] = {}  # a registered page's content key
        self.page_of: dict[bytes, int] = {}
        self.idle: OrderedDict[int, None] = OrderedDict()  # registered pages no sequence uses: oldest first
        self.hits = self.misses = 0  # pages reused / computed
        # Pages on disk (disk_pages.py): written on eviction and by ``persist``, read when the
        # walk of a prompt's pages goes past those in memory. A registered page's previous key and token ids
        # (what its file's header holds, and what a load checks).
        self.disk: Optional[DiskPages] = None
        self.disk_hits = 0  # pages read from disk instead of computed
        self.origin: dict[int, tuple[bytes, tuple[int, ...]]] = {}
        # Every registered page (whole or a tail) under the key of the page before it (the namespace for a first
        # page): where a prompt that differs inside a page looks for its longest match (``_partial``).
        self.after: dict[bytes, list[int]] = {}

    # -- memory --------------------------------------------------------------------------------------
    def _allocate(self, pages: int) -> None:
        shape = (self.layers, pages, self.kv_heads, self.page, self.row)
        old_k, old_v = self.k, self.v
        self.k = self.v = None
        # The native CPU kernels never read a page past what was written (attention and ``read`` stop at each
        # sequence's length), so their pool is not cleared: clearing touched every new byte at once, and growing for
        # a 2,000-token prompt beside a streaming reply was a 50 ms gap in its stream
        # (tools/benchmarks/prefill_stall_bench.py); untouched, the pages are taken from the system as the prompt's
        # keys are written. torch's graphed attention (paged_torch.attend_static) loads a sequence's last page
        # whole behind a mask, where never-written memory times a zero weight could be NaN: cleared. (A GPU's
        # memory is committed when allocated, so clearing costs no page faults there.)
        new = torch.zeros if self.cleared else torch.empty
        with weights_in_own_mappings():  # cache memory is model memory: returned whole on unload
            k = new(shape, dtype=self.dtype, device=self.device)
            v = new(shape, dtype=self.dtype, device=self.device)
        if old_k is not None:
            # Only pages ever handed out hold anything: copying the rest would make the system give them now.
            n = min(old_k.shape[1], self.high_water)
            k[:, :n] = old_k[:, :n]
            v[:, :n] = old_v[:, :n]
        self.k, self.v = k, v

    @property
    def pages(self) -> int:
        return self.k.shape[1]

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    def touched_bytes(self) -> int:
        """The pool's memory the system has given: uncleared, pages up to the highest ever handed out (the rest is
        address space until a key is written there); cleared, all of it."""
        if self.cleared:
            return self.nbytes
        return self.high_water * self.page_bytes

    @property
    def bytes_per_token(self) -> int:
        """KV bytes one position takes over every layer (keys and values; 8-bit rows with their scales)."""
        return 2 * self.layers * self.kv_heads * self.row * self.k.element_size()

    @property
    def page_bytes(self) -> int:
        return self.nbytes // max(1, self.pages)

    def tokens_held(self) -> int:
        return sum(len(t) for t in self.tables.values()) * self.page

    def cached_tokens(self) -> int:
        """Positions held by the prefix cache and used by no sequence (what it keeps for later turns): a whole page's
        64, a tail's own (its page takes a whole page's memory, ``cached_bytes``)."""
        return sum(len(self.origin[p][1]) if p in self.origin else self.page for p in self.idle)

    def cached_bytes(self) -> int:
        return len(self.idle) * self.page_bytes

    def set_cache(self, namespace: bytes, cache_pages: int, budget_pages: Optional[int] = None) -> None:
        """Turn the prefix cache on (``cache_pages`` > 0) for keys under ``namespace``, or off."""
        if namespace != self.namespace or cache_pages <= 0:
            self.forget_cache()
        self.namespace, self.cache_pages, self.budget_pages = namespace, max(0, cache_pages), budget_pages
        self._trim()

    def forget_cache(self) -> None:
        """Drop every cached page no sequence uses (they become free)."""
        for page in list(self.idle):
            self._unregister(page)
            self.free.append(page)
        self.idle.clear()
        self.free.sort()

    # -- sequences -----------------------------------------------------------------------------------
    def attach(self, seq: int, tokens: Sequence[int]) -> int:
        """Give a new sequence the cached pages of ``tokens``' longest cached prefix; returns how many positions
        (from 0) it need not compute. At least the last token is always left to compute (its logits are the
        reply's first)."""
        if self.cache_pages <= 0 or seq in self.tables or len(tokens) < 2:
            return 0
        usable = (len(tokens) - 1) // self.page
        keys = chain_keys(self.namespace, tokens, self.page, usable)
        taken = []
        for i, key in enumerate(keys):
            page = self.page_of.get(key)
            if page is not None:
                self.idle.pop(page, None)
                self.refs[page] = self.refs.get(page, 0) + 1
                self.hits += 1
            elif self.disk is not None:  # the walk goes on with the pages on disk
                page = self._from_disk(keys, i, tokens)
            if page is None:
                break
            taken.append(page)
        self.tables[seq] = taken
        self.misses += -(-len(tokens) // self.page) - len(taken)
        return len(taken) * self.page + self._partial(seq, tokens)

    def _partial(self, seq: int, tokens: Sequence[int]) -> int:
        """After the whole pages ``seq`` took: the registered page listed under the last one's key whose tokens
        start like the prompt's next ones for longest, copied into a page of ``seq``'s own; how many positions
        it holds (0: none starts the same)."""
        i = len(self.tables[seq])
        prev = self.key_of.get(self.tables[seq][-1]) if i else self.namespace
        rest = tokens[i * self.page : min(len(tokens) - 1, (i + 1) * self.page)]  # the last token is computed
        best, best_n = None, 0
        for page in self.after.get(prev, []) if prev is not None and rest else []:
            n = _common(self.origin[page][1], rest)
            if n > best_n:
                best, best_n = page, n
        if best is None:
            return 0
        # Out of the idle list while a page is taken, so that taking one cannot evict it.
        was_idle = best in self.idle
        self.idle.pop(best, None)
        with torch.inference_mode():  # a pool that grew during a step holds inference tensors (see _from_disk)
            page = self._take(1)[0]
            self.k[:, page, :, :best_n].copy_(self.k[:, best, :, :best_n])
            self.v[:, page, :, :best_n].copy_(self.v[:, best, :, :best_n])
        if was_idle:
            self.idle[best] = None  # now the most recently used
        self.tables[seq].append(page)
        self.refs[page] = 1
        return best_n

    def _from_disk(self, keys: list[bytes], i: int, tokens: Sequence[int]) -> Optional[int]:
        """Page ``i`` of ``tokens`` read from disk into a fresh page, registered and taken (None: not there, or its
        file was refused, and the rest of the prompt is computed)."""
        key, prev = keys[i], keys[i - 1] if i else self.namespace
        if not self.disk.has(key):
            return None
        page_tokens = tuple(tokens[i * self.page : (i + 1) * self.page])
        shape = (self.layers, self.kv_heads, self.page, self.row)
        loaded = self.disk.load(key, prev, page_tokens, self.dtype, shape)
        if loaded is None:
            return None
        # The walk runs before the request's first step, outside inference mode, and a pool that grew during a
        # step holds inference tensors, which only inference mode may write (ttft_accuracy's second engine failed).
        with torch.inference_mode():
            page = self._take(1)[0]
            self.k[:, page].copy_(loaded[0])
            self.v[:, page].copy_(loaded[1])
        self.key_of[page], self.page_of[key] = key, page
        self._list(page, prev, page_tokens)
        self.refs[page] = 1
        self.disk_hits += 1
        return page

    def persist(self) -> int:
        """Write every registered page not on disk yet (the model is being unloaded, Redline is quitting) and wait
        for the writes; how many pages were handed over."""
        if self.disk is None:
            return 0
        n = 0
        for page in list(self.idle) + [p for p in self.key_of if p not in self.idle]:
            n += self._save(page)
        self.disk.flush()
        return n

    def _save(self, page: int) -> int:
        key, origin = self.key_of.get(page), self.origin.get(page)
        if self.disk is None or key is None or origin is None:
            return 0
        self.disk.save(key, origin[0], origin[1], self.k[:, page], self.v[:, page])
        return 1

    def reserve(self, seq: int, length: int) -> None:
        """Make room for positions 0..length-1 of ``seq``."""
        table = self.tables.setdefault(seq, [])
        needed = -(-length // self.page) - len(table)
        if needed <= 0:
            return
        for page in self._take(needed):
            table.append(page)
            self.refs[page] = 1

    def make_room(self, lengths: dict[int, int]) -> None:
        """Grow the pool once, now, so that each sequence (seq → length) can reach its length without another
        growth (never past the budget). A growth copies the whole pool: grown by an eighth as
        a reply decodes, it stalled the reply every 128 tokens for longer each time (12 ms at 1,000 tokens, 20 ms
        at 1,900, beside a 4.7 ms step on the starter). Untouched pages cost address space, not memory: the
        system gives them as keys are written (``_allocate``)."""
        need = sum(max(0, -(-n // self.page) - len(self.tables.get(s, []))) for s, n in lengths.items())
        grow = need - len(self.free)
        if self.budget_pages is not None:
            grow = min(grow, self.budget_pages - self.pages)
        if grow > 0:
            self._grow(grow)

    def grow_to_budget(self) -> None:
        """The pool at its budget now (where one is set), so it never grows again: a graph compiled against the
        pool holds its address, and a grown pool is a new tensor (another capture)."""
        if self.budget_pages is not None and self.pages < self.budget_pages:
            self._grow(self.budget_pages - self.pages)

    def _grow(self, n: int) -> None:
        """``n`` more pages, free; a copy of the pages handed out so far (``_allocate``)."""
        self.free.extend(range(self.pages, self.pages + n))
        self._allocate(self.pages + n)

    def _take(self, n: int) -> list[int]:
        """``n`` pages to write into: free ones, then (when the cache is at its limit or the pool at its budget)
        the least recently used cached ones, else a grown pool."""
        while len(self.free) < n:
            cached = self.idle
            full = len(cached) >= self.cache_pages or (
                self.budget_pages is not None and self.pages + 1 > self.budget_pages
            )
            if cached and full:
                self._evict_oldest()
                continue
            # Grow by an eighth (at least what is needed): memory stays close to the tokens in use, and the copies
            # a growth costs stay few.
            grow = max(n - len(self.free), self.pages // 8, 1)
            if self.budget_pages is not None and cached:
                grow = max(n - len(self.free), min(grow, self.budget_pages - self.pages))
            self._grow(grow)
        taken, self.free = self.free[:n], self.free[n:]
        if taken:
            self.high_water = max(self.high_water, max(taken) + 1)
        return taken

    def _evict_oldest(self) -> None:
        page, _ = self.idle.popitem(last=False)
        self._save(page)  # to disk (when there is a store) before its memory is reused
        self._unregister(page)
        self.free.append(page)

    def _list(self, page: int, prev: bytes, tokens: tuple[int, ...]) -> None:
        """Page ``page`` (whole or a tail) holds ``tokens`` after the page keyed ``prev``. A cached tail whose
        tokens it starts with is dropped: every turn of a conversation leaves a tail that the next turn's page
        holds and goes on from, and each kept a page of the cache's room until it was evicted."""
        for old in list(self.after.get(prev, [])):
            held = self.origin[old][1]
            if old in self.idle and old not in self.key_of and len(held) < len(tokens) and tokens[: len(held)] == held:
                self.idle.pop(old)
                self._unregister(old)
                self.free.append(old)
        self.origin[page] = (prev, tokens)
        self.after.setdefault(prev, []).append(page)

    def _unregister(self, page: int) -> None:
        origin = self.origin.pop(page, None)
        if origin is not None:
            listed = self.after.get(origin[0], [])
            if page in listed:
                listed.remove(page)
            if not listed:
                self.after.pop(origin[0], None)
        key = self.key_of.pop(page, None)
        if key is not None and self.page_of.get(key) == page:
            del self.page_of[key]

    def release(self, seq: int, written: Optional[Sequence[int]] = None) -> None:
        """``seq`` ended. With ``written`` (the tokens whose keys and values it wrote, positions 0..), its full
        pages join the prefix cache; without (a failure, the cache off), only the pages others use stay."""
        table = self.tables.pop(seq, [])
        keep = written is not None and self.cache_pages > 0
        full = len(written) // self.page if keep else 0
        keys = chain_keys(self.namespace, written, self.page, min(full, len(table))) if keep else []
        kept: list[int] = []
        for i, page in enumerate(table):
            left = self.refs.get(page, 1) - 1
            if left > 0:
                self.refs[page] = left  # another sequence still reads it
                continue
            self.refs.pop(page, None)
            prev = (keys[i - 1] if i else self.namespace) if i <= len(keys) else None  # the key before page i
            if page not in self.key_of and i < len(keys):
                key = keys[i]
                if key in self.page_of:  # the same content is cached already (computed twice at once)
                    self.free.append(page)
                    continue
                self.key_of[page], self.page_of[key] = key, page
                self._list(page, prev, tuple(written[i * self.page : (i + 1) * self.page]))
            elif keep and i == full == len(keys) and prev is not None and len(written) > i * self.page:
                # The last, partial page: a tail, unless the same tokens are listed there already.
                tail = tuple(written[i * self.page :])
                if any(self.origin[p][1][: len(tail)] == tail for p in self.after.get(prev, [])):
                    self.free.append(page)
                    continue
                self._list(page, prev, tail)
            if page in self.origin and self.cache_pages > 0:
                kept.append(page)
            else:
                self._unregister(page)
                self.free.append(page)
        # Into the idle list last page first, so that eviction takes a sequence's pages from its end: a chain
        # evicted at its first page leaves every later page unreachable (each is found through the one before).
        for page in reversed(kept):
            self.idle[page] = None
            self.idle.move_to_end(page)
        self._trim()
        self.free.sort()

    def _trim(self) -> None:
        while len(self.idle) > self.cache_pages:
            self._evict_oldest()

    def table(self, seqs: list[int], width: int = 0, rows: int = 0, pad_page: int = 0) -> torch.Tensor:
        """[B, pages] int32: each sequence's pages in order, padded with its first page to the longest table (or
        ``width``); with ``rows`` (a batch bucket), padded with rows of ``pad_page`` only."""
        width = max([width] + [len(self.tables[s]) for s in seqs])
        table = [self.tables[s] + [self.tables[s][0]] * (width - len(self.tables[s])) for s in seqs]
        table += [[pad_page] * width for _ in range(rows - len(seqs))]
        return torch.tensor(table, dtype=torch.int32, device=self.device)

    # -- prefill: many positions of one sequence at once ----------------------------------------------
    def write(self, layer: int, seq: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v [T, Hkv, D] (any float dtype) at positions start..start+T-1, in the pool's form."""
        k, v = kv_quant.rows_as(k, self.k), kv_quant.rows_as(v, self.v)
        table, t, end = self.tables[seq], 0, start + k.shape[0]
        pos = start
        while pos < end:
            page, off = table[pos // self.page], pos % self.page
            n = min(self.page - off, end - pos)
            self.k[layer, page, :, off : off + n] = k[t : t + n].transpose(0, 1)
            self.v[layer, page, :, off : off + n] = v[t : t + n].transpose(0, 1)
            pos, t = pos + n, t + n

    def read(
        self, layer: int, seq: int, end: int, dtype: Optional[torch.dtype] = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of positions 0..end-1: [Hkv, end, D] each, in ``dtype`` (8-bit rows dequantised, to
        fp32 without one); without ``dtype`` the pool's own (a view when one page holds them)."""
        pages = self.tables[seq][: -(-end // self.page)]
        if len(pages) == 1:
            k, v = self.k[layer, pages[0], :, :end], self.v[layer, pages[0], :, :end]
        else:
            idx = torch.tensor(pages, device=self.device)
            k = self.k[layer].index_select(0, idx).transpose(0, 1).reshape(self.kv_heads, -1, self.row)[:, :end]
            v = self.v[layer].index_select(0, idx).transpose(0, 1).reshape(self.kv_heads, -1, self.row)[:, :end]
        if dtype is None and self.form == "q8":
            dtype = torch.float32
        if dtype is None:
            return k, v
        return kv_quant.rows_from(k, dtype), kv_quant.rows_from(v, dtype)
