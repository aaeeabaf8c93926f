"""plotly.js, served from the installed `plotly` package (its wheel ships plotly.min.js): nothing from a CDN,
no third-party code in the repository."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from django.http import FileResponse, Http404
from django.views.decorators.cache import cache_control


@lru_cache(maxsize=1)
def plotly_js_path() -> Path:
    import plotly

    path = Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: reinstall the pinned plotly package")
    return path


@cache_control(public=True, max_age=86400)
def plotly_js(request):
    try:
        path = plotly_js_path()
    except (ImportError, FileNotFoundError) as exc:
        raise Http404(str(exc)) from exc
    return FileResponse(path.open("rb"), content_type="text/javascript; charset=utf-8")
