"""Sphinx configuration of the sklearn-cuwide documentation.

Build (warnings are errors, as in CI)::

    pip install -e ".[docs]"
    python -m sphinx -W --keep-going -b html docs docs/_build/html
    python -m sphinx -W --keep-going -b doctest docs docs/_build/doctest

The build needs no network: intersphinx links to the Python, NumPy, SciPy
and scikit-learn docs are only set up when the environment variable
``SKLEARN_CUWIDE_DOCS_INTERSPHINX=1`` asks for them.
"""

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
# the package from the source tree (an editable install finds the same one)
sys.path.insert(0, str(ROOT))
# the local extension (benchmark results)
sys.path.insert(0, str(DOCS / "_ext"))

import sklearn_cuwide  # noqa: E402

# -- project -----------------------------------------------------------------
project = "sklearn-cuwide"
author = "the sklearn-cuwide developers"
copyright = "the sklearn-cuwide developers"
version = release = sklearn_cuwide.__version__

# -- extensions --------------------------------------------------------------
extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.doctest",
    "sphinx.ext.intersphinx",
    "sphinx.ext.mathjax",
    "numpydoc",
    "benchmark_results",  # docs/_ext: .. benchmark-results:: (MyST when installed)
]

templates_path = ["_templates"]
exclude_patterns = ["_build", "**/.ipynb_checkpoints"]
source_suffix = {".rst": "restructuredtext"}
root_doc = "index"
nitpicky = False
# MyST (the benchmark tables are markdown): heading levels of an included
# file do not follow ours, and its local links are rewritten by the extension
suppress_warnings = ["myst.header", "myst.xref_missing"]

# -- autodoc / autosummary / numpydoc ----------------------------------------
autosummary_generate = True  # stubs in docs/api/generated/ (git-ignored)
autosummary_imported_members = False
autodoc_default_options = {"member-order": "bysource"}
autodoc_typehints = "none"  # the numpydoc docstrings carry the types
numpydoc_show_class_members = False  # the class template lists the methods
numpydoc_class_members_toctree = False
numpydoc_attributes_as_param_list = True

# -- doctest -----------------------------------------------------------------
# Every example runs on the CPU (device="cpu" where it matters), in seconds.
doctest_global_setup = """
import numpy as np
np.set_printoptions(precision=4, suppress=True)
"""
doctest_default_flags = (
    __import__("doctest").ELLIPSIS
    | __import__("doctest").NORMALIZE_WHITESPACE
    | __import__("doctest").IGNORE_EXCEPTION_DETAIL
    | __import__("doctest").DONT_ACCEPT_TRUE_FOR_1
)

# -- intersphinx: off unless asked for (the build must not need the network) -
intersphinx_mapping = {}
if os.environ.get("SKLEARN_CUWIDE_DOCS_INTERSPHINX") == "1":
    intersphinx_mapping = {
        "python": ("https://docs.python.org/3", None),
        "numpy": ("https://numpy.org/doc/stable", None),
        "scipy": ("https://docs.scipy.org/doc/scipy", None),
        "sklearn": ("https://scikit-learn.org/stable", None),
    }

# -- HTML --------------------------------------------------------------------
try:
    import pydata_sphinx_theme  # noqa: F401

    html_theme = "pydata_sphinx_theme"
    html_theme_options = {
        "show_toc_level": 2,
        "navigation_with_keys": False,
        "secondary_sidebar_items": ["page-toc"],
        "footer_start": ["copyright"],
        "footer_end": ["sphinx-version"],
    }
except ImportError:  # the build still works with Sphinx's default theme
    html_theme = "alabaster"
    html_theme_options = {}

html_title = f"sklearn-cuwide {release}"
# pages without sub-pages need no section navigation
html_sidebars = {
    page: []
    for page in ("index", "getting_started", "user_guide", "performance", "architecture")
}
html_static_path = ["_static"]
html_show_sourcelink = False


# -- docstring fix-ups -------------------------------------------------------
_SHAPE = __import__("re").compile(r"shape \(([^()]*)\)")
_TRAILING_UNDERSCORE = __import__("re").compile(r"(?<![`\w])([A-Za-z]\w*_)(?![`\w])")


def _quote_fitted_names_in_shapes(app, what, name, obj, options, lines):
    """``shape (n_features_in_,)`` -> ``shape (``n_features_in_``,)``.

    A name ending in ``_`` is a hyperlink reference in reStructuredText; in a
    numpydoc type such as ``ndarray of shape (n_features_in_,)`` it would be
    an unknown target.  Runs before numpydoc (lower priority number).
    """

    def quote(m):
        return "shape (" + _TRAILING_UNDERSCORE.sub(r"``\1``", m.group(1)) + ")"

    lines[:] = [_SHAPE.sub(quote, line) for line in lines]


def setup(app):
    app.connect("autodoc-process-docstring", _quote_fitted_names_in_shapes, priority=400)
