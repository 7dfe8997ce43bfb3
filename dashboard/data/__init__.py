"""What each dashboard page reads, without drawing it: one module per page (``overview``, ``explorer``, ``logs``,
``sessions``, ``stragglers``, ``alerts``), each a function per step of the page that runs every store query of that
step and gives the results back as a dataclass.

The page script (``dashboard/views/``) calls these and only draws; the benchmark (``bench/dashboard_pages.py``,
``bench/log_search.py``) calls the very same functions, so what it times is what a page waits for. Nothing here
imports Streamlit (tests/unit/test_layout.py), and a page script runs no query of its own
(tests/unit/dashboard/test_pages_read_through_data.py).
"""
