"""The HTMX dialog pattern shared by every app: a fragment rendered into the one <dialog> shell of
base.html, or the same fragment as a whole page when the request is not from HTMX."""
from __future__ import annotations

import json

from django.http import HttpResponse
from django.shortcuts import redirect, render


def dialog(request, fragment: str, context: dict, *, back: str, page: str = "mado/dialog_page.html"):
    """`back` is where the whole page's Cancel/Done lead (inside the dialog they just close it);
    `page` is the whole-page template that includes the fragment."""
    context = {**context, "back_url": back}
    if request.htmx:
        return render(request, fragment, context)
    return render(request, page, {**context, "fragment": fragment})


def dialog_done(request, event: str, fallback_url: str):
    """Close the dialog and tell the page what changed; without HTMX, go back to the list."""
    if request.htmx:
        response = HttpResponse(status=204)
        response["HX-Trigger"] = json.dumps({event: True, "closeDialog": True})
        return response
    return redirect(fallback_url)
