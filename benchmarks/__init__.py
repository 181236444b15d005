"""The benchmark harness of sklearn-cuwide: ``python -m benchmarks --help``.

Modules: :mod:`.configs` (sizes, settings, budgets), :mod:`.data` (synthetic
and real data), :mod:`.systems` (ours and the peers, the floors),
:mod:`.startup` (the first fit of a fresh process, cold and warm kernel
cache), :mod:`.report` (results.json, results.md, plots, the short table)
and :mod:`.suite` (the parts and the command line).  Nothing here is imported by
the package.
"""
