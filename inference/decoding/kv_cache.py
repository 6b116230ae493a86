"""The fast path's KV cache: pages of keys and values that sequences take as they grow.

Memory follows the tokens in use, not the longest context times the most sequences: a sequence holds
``ceil(length / page)`` pages, freed when it ends, and the pool grows (by an eighth) only when every page
is taken. Two shapes of the same idea:

- small pages (64 tokens) where Redline's native attention kernel reads them through a page table (CPU);
- one page per sequence, as long as its context, where attention runs on torch's operators with static
  shapes (CUDA, so a decode step can be captured in a CUDA graph; a CPU without the native kernels). The
  page grows (doubling, copied) when a sequence outgrows it.
"""

from __future__ import annotations

import torch

from redline.inference.memory.policy import weights_in_own_mappings

PAGE_TOKENS = 64


class PagedKV:
    def __init__(
        self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device, paged: bool, tokens: int = 256
    ):
        self.layers, self.kv_heads, self.head_dim = layers, kv_heads, head_dim
        self.dtype, self.device, self.paged = dtype, torch.device(device), paged
        self.page = PAGE_TOKENS if paged else _round_up_pow2(tokens)
        pages = max(1, -(-tokens // self.page)) if paged else 1
        self.k = self.v = None
        self._allocate(pages)
        self.free = list(range(pages))
        self.tables: dict[int, list[int]] = {}

    # -- memory --------------------------------------------------------------------------------------
    def _allocate(self, pages: int) -> None:
        shape = (self.layers, pages, self.kv_heads, self.page, self.head_dim)
        old_k, old_v = self.k, self.v
        self.k = self.v = None
        with weights_in_own_mappings():  # cache memory is model memory: returned whole on unload
            k = torch.zeros(shape, dtype=self.dtype, device=self.device)
            v = torch.zeros(shape, dtype=self.dtype, device=self.device)
        if old_k is not None:
            n, t = old_k.shape[1], old_k.shape[3]
            k[:, :n, :, :t] = old_k
            v[:, :n, :, :t] = old_v
        self.k, self.v = k, v

    @property
    def pages(self) -> int:
        return self.k.shape[1]

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    def tokens_held(self) -> int:
        return sum(len(t) for t in self.tables.values()) * self.page

    # -- sequences -----------------------------------------------------------------------------------
    def reserve(self, seq: int, length: int) -> None:
        """Make room for positions 0..length-1 of ``seq``."""
        table = self.tables.setdefault(seq, [])
        if not self.paged:
            if length > self.page:  # one page per sequence: grow the page itself
                old_page = self.page
                self.page = _round_up_pow2(length)
                pages = self.pages
                self._grow_page(old_page, pages)
            if not table:
                if not self.free:
                    self.free = list(range(self.pages, self.pages + max(1, self.pages)))
                    self._allocate(self.pages * 2)
                table.append(self.free.pop(0))
            return
        needed = -(-length // self.page) - len(table)
        if needed <= 0:
            return
        if needed > len(self.free):
            # Grow by an eighth (at least what is needed): memory stays close to the tokens in use, and the
            # copies a growth costs stay few.
            grow = max(needed - len(self.free), self.pages // 8, 1)
            self.free.extend(range(self.pages, self.pages + grow))
            self._allocate(self.pages + grow)
        for _ in range(needed):
            table.append(self.free.pop(0))

    def _grow_page(self, old_page: int, pages: int) -> None:
        old_k, old_v = self.k, self.v
        self.k = self.v = None
        shape = (self.layers, pages, self.kv_heads, self.page, self.head_dim)
        with weights_in_own_mappings():
            self.k = torch.zeros(shape, dtype=self.dtype, device=self.device)
            self.v = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.k[:, :, :, :old_page] = old_k
        self.v[:, :, :, :old_page] = old_v

    def release(self, seq: int) -> None:
        self.free.extend(self.tables.pop(seq, []))
        self.free.sort()

    def table(self, seqs: list[int]) -> torch.Tensor:
        """[B, pages] int32: each sequence's pages in order (padded with its first page)."""
        width = max(len(self.tables[s]) for s in seqs)
        rows = [self.tables[s] + [self.tables[s][0]] * (width - len(self.tables[s])) for s in seqs]
        return torch.tensor(rows, dtype=torch.int32, device=self.device)

    # -- prefill: many positions of one sequence at once ----------------------------------------------
    def write(self, layer: int, seq: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v [T, Hkv, D] at positions start..start+T-1."""
        table, t, end = self.tables[seq], 0, start + k.shape[0]
        pos = start
        while pos < end:
            page, off = table[pos // self.page], pos % self.page
            n = min(self.page - off, end - pos)
            self.k[layer, page, :, off : off + n] = k[t : t + n].transpose(0, 1)
            self.v[layer, page, :, off : off + n] = v[t : t + n].transpose(0, 1)
            pos, t = pos + n, t + n

    def read(self, layer: int, seq: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of positions 0..end-1: [Hkv, end, D] each (a view when one page holds them)."""
        pages = self.tables[seq][: -(-end // self.page)]
        if len(pages) == 1:
            return self.k[layer, pages[0], :, :end], self.v[layer, pages[0], :, :end]
        idx = torch.tensor(pages, device=self.device)
        k = self.k[layer].index_select(0, idx).transpose(0, 1).reshape(self.kv_heads, -1, self.head_dim)
        v = self.v[layer].index_select(0, idx).transpose(0, 1).reshape(self.kv_heads, -1, self.head_dim)
        return k[:, :end], v[:, :end]


def _round_up_pow2(n: int) -> int:
    return 1 << max(8, (max(1, n) - 1).bit_length())
