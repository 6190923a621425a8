"""``--html``: the page of one ``xflow optimize`` run (``page.render``), drawn with a small layered layout
(``layout``), the rewrites' pictures (``pictures``) and the timing charts (``charts``), all inline SVG."""

from xflow.cli.html.page import render

__all__ = ["render"]
