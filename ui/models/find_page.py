""" "Find a model": search the hub, pick a repository, see every variant predicted on this machine, fetch one.

Typing and pressing Enter (or Search) searches; choosing a result reads its variants (``config.json``, or each
GGUF's header by range reads) and predicts each for the context chosen: memory, fits / tight / does not fit,
decode tokens/s and TTFT, the download's size, and the one recommended here by the user's priority (selected
for them). Fetch downloads the selected variant with progress and Cancel; when it is done ``fetched`` carries
what to load (``Fetched``: the model, the precision and strategy predicted). Everything that touches the
network or reads files runs on ``BackgroundWork``'s threads; the page only shows what comes back. Offline, or
when the hub cannot be reached, the status says so in one sentence and the library page still works.
"""

from __future__ import annotations

from typing import Callable, Optional

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from ...inference import (
    FITS,
    NO_FIT,
    TIGHT,
    Cancelled,
    RedlineError,
    fetch_variant,
    format_bytes,
    machine_target,
    predict_repo,
    process_rss,
    repo_variants,
    search_hub,
    warm_up_browser,
)
from ..signals import emit
from .background import BackgroundWork

RESULT_COLUMNS = ("Model", "Kind", "Parameters", "Downloads", "Licence", "Gated")
VARIANT_COLUMNS = ("Variant", "Download", "Memory here", "Fit", "Decode tok/s", "TTFT", "")
FIT_COLOURS = {FITS: "#2e7d32", TIGHT: "#b26a00", NO_FIT: "#c62828"}


def sentence(exc: BaseException) -> str:
    if isinstance(exc, RedlineError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}".splitlines()[0]


def params_text(n: Optional[int]) -> str:
    if not n:
        return "?"
    return f"{n / 1e9:.1f} B" if n >= 1e9 else f"{n / 1e6:.0f} M" if n >= 1e6 else f"{n / 1e3:.0f} K"


def _item(text: str, data=None) -> QTableWidgetItem:
    item = QTableWidgetItem(text)
    item.setFlags(item.flags() & ~Qt.ItemIsEditable)
    if data is not None:
        item.setData(Qt.UserRole, data)
    return item


def _table(columns) -> QTableWidget:
    t = QTableWidget(0, len(columns))
    t.setHorizontalHeaderLabels(list(columns))
    t.setSelectionBehavior(QAbstractItemView.SelectRows)
    t.setSelectionMode(QAbstractItemView.SingleSelection)
    t.verticalHeader().setVisible(False)
    t.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
    t.horizontalHeader().setStretchLastSection(True)
    return t


class FindModelPage(QWidget):
    fetched = Signal(object)  # a Fetched
    status_changed = Signal(str)

    def __init__(self, priority: str = "balanced", machine: Optional[Callable] = None, parent=None):
        super().__init__(parent)
        self.priority = priority
        self._machine_fn = machine or machine_target
        self._machine = None  # (target, speed model, correction), read once off the UI thread
        self.baseline_from_process = machine is None  # a given machine (a test's) keeps the default baseline
        self.work = BackgroundWork(self)
        self.repo = None  # the RepoVariants shown
        self.predictions: list = []
        self._cancel = False
        v = QVBoxLayout(self)
        row = QHBoxLayout()
        self.query = QLineEdit()
        self.query.setObjectName("findQuery")
        self.query.setPlaceholderText("Search the Hugging Face hub, e.g. qwen 1.5b instruct gguf")
        self.sort = QComboBox()
        self.sort.addItems(["downloads", "trending", "likes"])
        self.search_button = QPushButton("&Search")
        row.addWidget(self.query, 1)
        row.addWidget(QLabel("by"))
        row.addWidget(self.sort)
        row.addWidget(self.search_button)
        v.addLayout(row)
        self.results = _table(RESULT_COLUMNS)
        self.results.setObjectName("findResults")
        v.addWidget(self.results, 2)
        ctx = QHBoxLayout()
        self.repo_label = QLabel("Choose a model above to see its variants predicted on this machine.")
        self.repo_label.setWordWrap(True)
        self.context = QSpinBox()
        self.context.setRange(256, 131072)
        self.context.setSingleStep(1024)
        self.context.setValue(4096)
        self.context.setSuffix(" tokens")
        ctx.addWidget(self.repo_label, 1)
        ctx.addWidget(QLabel("Context:"))
        ctx.addWidget(self.context)
        v.addLayout(ctx)
        self.variants = _table(VARIANT_COLUMNS)
        self.variants.setObjectName("findVariants")
        v.addWidget(self.variants, 2)
        bottom = QHBoxLayout()
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setVisible(False)
        self.fetch_button = QPushButton("&Fetch")
        self.fetch_button.setEnabled(False)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setVisible(False)
        bottom.addWidget(self.progress, 1)
        bottom.addStretch(0)
        bottom.addWidget(self.cancel_button)
        bottom.addWidget(self.fetch_button)
        v.addLayout(bottom)
        self.status = QLabel("")
        self.status.setObjectName("findStatus")
        self.status.setWordWrap(True)
        v.addWidget(self.status)

        self.query.returnPressed.connect(self.search)
        self.search_button.clicked.connect(self.search)
        self.results.itemSelectionChanged.connect(self._on_result_selected)
        self.variants.itemSelectionChanged.connect(self._update_fetch)
        self.context.editingFinished.connect(self._repredict)
        self.fetch_button.clicked.connect(self.fetch)
        self.cancel_button.clicked.connect(self.cancel)
        # What the first search and header read import, imported now while the user types (off the UI thread).
        self.warmed = False
        self.work.run("warm", warm_up_browser, self._on_warm, lambda exc: self._on_warm(None))

    def _on_warm(self, _result) -> None:
        self.warmed = True

    # ---------------------------------------------------------------- status
    def say(self, text: str) -> None:
        self.status.setText(text)
        emit(self.status_changed, text)

    # ---------------------------------------------------------------- search
    def search(self) -> None:
        query, sort = self.query.text(), self.sort.currentText()
        self.say(f"Searching the hub for “{query}”…")
        self.search_button.setEnabled(False)
        self.work.run("search", lambda: search_hub(query, sort=sort), self._show_results, self._search_failed)

    def _search_failed(self, exc: BaseException) -> None:
        self.search_button.setEnabled(True)
        self.results.setRowCount(0)
        self.say(sentence(exc))

    def _show_results(self, rows) -> None:
        self.search_button.setEnabled(True)
        self.results.setRowCount(len(rows))
        for i, r in enumerate(rows):
            cells = (
                r.repo_id,
                r.kind,
                params_text(r.parameters),
                f"{r.downloads:,}",
                r.license or "?",
                "gated" if r.gated else "",
            )
            for j, text in enumerate(cells):
                self.results.setItem(i, j, _item(text, r if j == 0 else None))
        none = "No text-generation model Redline can run matches."
        self.say(f"{len(rows)} models Redline can run." if rows else none)

    def result(self, row: int):
        item = self.results.item(row, 0)
        return item.data(Qt.UserRole) if item is not None else None

    # ---------------------------------------------------------------- variants
    def _on_result_selected(self) -> None:
        rows = self.results.selectionModel().selectedRows()
        if not rows:
            return
        model = self.result(rows[0].row())
        if model is None:
            return
        self.open_repo(model.repo_id, gated=model.gated)

    def open_repo(self, repo_id: str, gated: bool = False) -> None:
        self.repo = None
        self.predictions = []
        self.variants.setRowCount(0)
        self._update_fetch()
        self.repo_label.setText(f"{repo_id}: reading what each variant's estimate needs (no weights)…")
        self.say(f"Reading {repo_id}…")
        context, priority = self.context.value(), self.priority

        def job():
            if self._machine is None:
                self._machine = self._machine_fn()
            target, speed, correction = self._machine
            rv = repo_variants(repo_id, target.device)
            return rv, predict_repo(rv, context, priority, target, speed, correction, self._baseline())

        self.work.run("variants", job, self._show_variants, lambda exc: self._variants_failed(repo_id, exc))

    def _variants_failed(self, repo_id: str, exc: BaseException) -> None:
        self.repo_label.setText(f"{repo_id}: no variants read.")
        self.say(sentence(exc))

    def _repredict(self) -> None:
        if self.repo is None:
            return
        rv, context, priority = self.repo, self.context.value(), self.priority

        def job():
            target, speed, correction = self._machine
            return rv, predict_repo(rv, context, priority, target, speed, correction, self._baseline())

        self.work.run("variants", job, self._show_variants, self._search_failed)

    def _baseline(self):
        """The model loads in this process (the window's engine): its resident memory is the CPU baseline."""
        return process_rss() if self.baseline_from_process else None

    def _show_variants(self, got) -> None:
        rv, preds = got
        self.repo, self.predictions = rv, preds
        target = self._machine[0]
        self.repo_label.setText(
            f"{rv.repo_id} ({rv.kind}{', gated' if rv.gated else ''}): predicted on {target.label}, "
            f"{format_bytes(target.available_bytes)} available, at {preds[0].context if preds else '?'} tokens"
        )
        self.variants.setRowCount(len(preds))
        recommended = None
        for i, p in enumerate(preds):
            cells = (
                p.name,
                format_bytes(p.download_bytes),
                format_bytes(p.total_bytes) if p.total_bytes else "?",
                p.fit,
                f"{p.tokens_per_s:.1f}" if p.tokens_per_s else "?",
                f"{p.ttft_ms:.0f} ms" if p.ttft_ms else "?",
                ("★ recommended here: " + p.why) if p.recommended else p.why,
            )
            for j, text in enumerate(cells):
                item = _item(text, i if j == 0 else None)
                if j == 3 and p.fit in FIT_COLOURS:
                    item.setForeground(Qt.GlobalColor.white)
                    item.setBackground(_colour(FIT_COLOURS[p.fit]))
                self.variants.setItem(i, j, item)
            if p.recommended:
                recommended = i
        if recommended is not None:
            self.variants.selectRow(recommended)
        read = sum(v.header_bytes_read for v in rv.variants)
        what = f"; {format_bytes(read)} of GGUF headers read" if read else ""
        self.say(f"{len(preds)} variants of {rv.repo_id}{' (from the cache)' if rv.from_cache else ''}{what}.")
        self._update_fetch()

    def selected_variant(self) -> Optional[int]:
        rows = self.variants.selectionModel().selectedRows()
        return rows[0].row() if rows else None

    def _update_fetch(self) -> None:
        i = self.selected_variant()
        ok = i is not None and self.repo is not None and not self.work.busy("fetch")
        if ok and self.repo.variants[i].problem:
            ok = False
        self.fetch_button.setEnabled(ok)

    # ---------------------------------------------------------------- fetch
    def fetch(self) -> None:
        i = self.selected_variant()
        if i is None or self.repo is None:
            return
        rv, variant, pred = self.repo, self.repo.variants[i], self.predictions[i]
        self._cancel = False
        self.progress.setValue(0)
        self.progress.setVisible(True)
        self.cancel_button.setVisible(True)
        self.fetch_button.setEnabled(False)
        self.say(f"Fetching {rv.repo_id} {variant.name} ({format_bytes(variant.download_bytes)})…")

        def job(progress):
            return fetch_variant(rv, variant, pred, progress, lambda: self._cancel)

        self.work.run("fetch", job, self._fetched, self._fetch_failed, self._fetch_progress, pool="fetch")

    def cancel(self) -> None:
        self._cancel = True
        self.say("Cancelling; what was downloaded is kept, and fetching again continues it.")

    def _fetch_progress(self, fraction: float, phase: str) -> None:
        self.progress.setValue(int(fraction * 1000))
        self.say(phase)

    def _fetch_done(self) -> None:
        self.progress.setVisible(False)
        self.cancel_button.setVisible(False)
        self._update_fetch()

    def _fetch_failed(self, exc: BaseException) -> None:
        self._fetch_done()
        if isinstance(exc, Cancelled):
            self.say("Cancelled; what was downloaded is kept, and fetching again continues it.")
        else:
            self.say(sentence(exc))

    def _fetched(self, got) -> None:
        self._fetch_done()
        self.say(f"Fetched: it loads as {got.model} at {got.precision}, as predicted.")
        emit(self.fetched, got)

    def shutdown(self) -> None:
        self._cancel = True
        self.work.shutdown()


def _colour(name: str):

    return QColor(name)
