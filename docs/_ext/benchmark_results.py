"""``.. benchmark-results:: PATH``: show a committed benchmark file if it exists.

``PATH`` is relative to the repository root (e.g.
``benchmarks/results/results.md``).  What the directive does:

* a markdown file (``.md``) is parsed with MyST when ``myst-parser`` is
  installed (pipe tables become tables; headings become rubrics so they
  never clash with the page's own sections; relative image paths are made
  relative to the page, links to other local files become inline code) and
  shown as a literal block otherwise;
* an image (``.png``, ``.svg``, ``.jpg``) becomes a figure, with the
  ``:caption:`` option as its caption;
* a reStructuredText file (``.rst``) is included as it is; anything else is
  shown as a literal block;
* a file that does not exist (yet) gives a note: the directive's content if
  it has one, else a sentence that says which script produces it; with the
  ``:optional:`` flag it gives nothing at all.  A page can therefore list
  the result files before the benchmarks have been run, and the build never
  breaks because one is absent.

The file is recorded as a dependency of the page, so an incremental build
picks up a new or changed result.
"""

import os
import re
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from docutils.utils import new_document
from sphinx.util.docutils import SphinxDirective

IMAGE_SUFFIXES = {".png", ".svg", ".jpg", ".jpeg", ".gif"}
_MD_LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)((?:\s+\"[^\"]*\")?)\)")


def _is_local(target):
    return not (
        "://" in target or target.startswith(("#", "mailto:", "/")) or not target
    )


def _rewrite_markdown(text, md_dir, doc_dir, root):
    """Make the markdown's relative paths work from the page that shows it."""

    def repl(m):
        bang, label, target, title = m.groups()
        if not _is_local(target):
            return m.group(0)
        path = (md_dir / target).resolve()
        if bang:  # an image: relative to the page
            return f"{bang}[{label}]({os.path.relpath(path, doc_dir)}{title})"
        try:
            shown = path.relative_to(root).as_posix()
        except ValueError:
            shown = target
        return f"{label} (`{shown}`)"

    return _MD_LINK.sub(repl, text)


def _flatten_sections(node_list):
    """Replace section nodes by a rubric with the title plus their body."""
    out = []
    for node in node_list:
        if isinstance(node, nodes.section):
            title = node.next_node(nodes.title)
            if title is not None:
                out.append(nodes.rubric(title.astext(), title.astext()))
            out.extend(
                _flatten_sections([c for c in node.children if c is not title])
            )
        else:
            out.append(node)
    return out


class BenchmarkResults(SphinxDirective):
    required_arguments = 1
    optional_arguments = 0
    has_content = True
    option_spec = {
        "caption": directives.unchanged,
        "alt": directives.unchanged,
        "width": directives.length_or_percentage_or_unitless,
        "optional": directives.flag,
    }

    def run(self):
        rel = self.arguments[0].strip()
        root = Path(self.env.srcdir).resolve().parent
        path = (root / rel).resolve()
        if not path.is_file():
            return [] if "optional" in self.options else self._missing(rel)
        self.env.note_dependency(str(path))
        suffix = path.suffix.lower()
        if suffix in IMAGE_SUFFIXES:
            return self._figure(path)
        text = path.read_text(encoding="utf-8")
        if suffix == ".md":
            return self._markdown(path, text, root)
        if suffix == ".rst":
            self.state_machine.insert_input(text.splitlines(), str(path))
            return []
        return [self._literal(text, "text")]

    # ------------------------------------------------------------------
    def _doc_dir(self):
        return Path(self.env.doc2path(self.env.docname)).resolve().parent

    def _parse_rst(self, text):
        box = nodes.container()
        self.state.nested_parse(
            StringList(text.splitlines(), source=self.get_source_info()[0]),
            self.content_offset,
            box,
        )
        return box.children

    def _missing(self, rel):
        if self.content:
            body = "\n".join(self.content)
        else:
            body = (
                f"``{rel}`` is not in this checkout yet: it is written by the "
                "scripts in ``benchmarks/`` (see *Running the benchmarks* above)."
            )
        note = nodes.note()
        note.extend(self._parse_rst(body))
        return [note]

    def _figure(self, path):
        uri = os.path.relpath(path, self._doc_dir()).replace(os.sep, "/")
        lines = [f".. figure:: {uri}"]
        lines.append(f"   :alt: {self.options.get('alt', path.stem)}")
        if "width" in self.options:
            lines.append(f"   :width: {self.options['width']}")
        caption = " ".join(self.options.get("caption", "").split())
        if caption:
            lines += ["", f"   {caption}"]
        return self._parse_rst("\n".join(lines))

    def _literal(self, text, language):
        block = nodes.literal_block(text, text)
        block["language"] = language
        return block

    def _markdown(self, path, text, root):
        try:
            from myst_parser.parsers.sphinx_ import MystParser
        except ImportError:
            return [self._literal(text, "markdown")]
        text = _rewrite_markdown(text, path.parent, self._doc_dir(), root)
        doc = new_document(str(path), self.state.document.settings)
        MystParser().parse(text, doc)
        return _flatten_sections(list(doc.children))


def setup(app):
    try:
        import myst_parser  # noqa: F401
    except ImportError:
        pass
    else:
        app.setup_extension("myst_parser")
    app.add_directive("benchmark-results", BenchmarkResults)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
