"""What a newcomer must never meet on a dashboard page, read from the page as Chromium drew it (issue 54's walk).

:func:`problems` opens one page, waits until it settled and lists, in words, every:
- exception box;
- chart with nothing drawn in it and no words saying why (an annotation of the figure);
- placeholder date (``1970``) anywhere in the page's text or its tables' cells;
- table cell that shows a missing value (Streamlit draws ``None`` for it; its accessible text is empty);
- legend title drawn over a legend entry, or legend over the chart's title (their boxes overlap).
"""

from __future__ import annotations

from typing import Any

from playwright.sync_api import BrowserContext

from tests.support.browser import opened

# Per chart: its title, how many points its traces hold as Plotly decoded them (non-null y, or x for horizontal bars
# and histograms of x), its annotations' texts, and the boxes of its title, legend title and legend entries.
_CHARTS = """() => [...document.querySelectorAll('[data-testid="stPlotlyChart"] .js-plotly-plot')].map(gd => {
    const filled = v => v !== null && v !== undefined && !(typeof v === 'number' && isNaN(v));
    const count = a => !a ? 0 : (ArrayBuffer.isView(a) ? a.length : Array.from(a).filter(filled).length);
    const points = (gd._fullData || []).filter(t => t.visible !== false).map(t => Math.max(count(t.y),
        t.type === 'histogram' || t.orientation === 'h' ? count(t.x) : 0)).reduce((a, b) => a + b, 0);
    const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
    const title = gd.querySelector('.legendtitletext');
    const entries = [...gd.querySelectorAll('.legend .traces .legendtext')].map(box);
    const chartTitle = gd.querySelector('.gtitle');
    return {title: ((gd.layout || {}).title || {}).text || '', points,
            notes: ((gd.layout || {}).annotations || []).map(a => a.text || ''),
            legendTitle: title && title.textContent ? box(title) : null, entries,
            chartTitle: chartTitle && chartTitle.textContent ? box(chartTitle) : null};
})"""


MISSING_TEXTS = ("None", "nan", "NaN", "NaT", "<NA>")


def _overlap(a: list[float], b: list[float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def problems(browser: BrowserContext, url: str, name: str) -> list[str]:
    """Everything wrong on the page at ``url`` (``name`` prefixes each finding), once it settled."""
    found: list[str] = []
    with opened(browser, url, settle_s=90) as page:
        # Tables are drawn on a canvas; their accessible grid (cells' text) mounts a moment after.
        page.wait_for_timeout(1500)
        for box in page.locator('[data-testid="stException"]').all_inner_texts():
            found.append(f"{name}: exception box: {box.strip()[:200]}")
        main_text = page.locator('[data-testid="stMain"]').inner_text()
        if "1970" in main_text:
            found.append(f"{name}: a 1970 date in the page's text")
        for table, cells in enumerate(page.evaluate("""() => [...document.querySelectorAll(
                '[data-testid="stDataFrame"]')].map(t => [...t.querySelectorAll('[role="gridcell"]')]
                .map(c => [c.getAttribute('aria-colindex'), c.textContent.trim()]))""")):
            columns: dict[str, list[str]] = {}
            for column, text in cells:
                columns.setdefault(column, []).append(text)
            for column, texts in columns.items():
                if any("1970" in t for t in texts):
                    found.append(f"{name}: table {table} column {column} shows a 1970 date")
                # A cell's accessible text is empty where Streamlit draws "None" (and in a link column's cell
                # without a link, which draws nothing: a column whose cells are links).
                links = any(t.startswith(("/", "http")) for t in texts)
                bad = [t for t in texts if t in MISSING_TEXTS or (t == "" and not links)]
                if bad:
                    found.append(f"{name}: table {table} column {column} shows a missing value ({len(bad)} cells)")
        charts: list[dict[str, Any]] = page.evaluate(_CHARTS)
        for chart in charts:
            if chart["points"] == 0 and not any(note.strip() for note in chart["notes"]):
                found.append(f"{name}: chart {chart['title']!r} is empty and does not say why")
            if chart["legendTitle"] and any(_overlap(chart["legendTitle"], e) for e in chart["entries"]):
                found.append(f"{name}: chart {chart['title']!r}: its legend title overlaps a legend entry")
            legend = [*chart["entries"], *([chart["legendTitle"]] if chart["legendTitle"] else [])]
            if chart["chartTitle"] and any(_overlap(chart["chartTitle"], b) for b in legend):
                found.append(f"{name}: chart {chart['title']!r}: its legend is drawn over its title")
    return found
