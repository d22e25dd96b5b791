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


def dialog_shown_once(request, fragment: str, context: dict, *, event: str, back: str,
                      page: str = "mado/dialog_page.html"):
    """A dialog showing a secret (a token, a link) that is never shown again, so never cached; the page
    behind it hears `event` and refreshes its list."""
    response = dialog(request, fragment, context, back=back, page=page)
    response["Cache-Control"] = "no-store"
    if request.htmx:
        response["HX-Trigger"] = json.dumps({event: True})
    return response


def page_or_part(request, page: str, part: str, context: dict, *, fragment: str = "list"):
    """The whole page, or only the part an HTMX request reloads (?fragment=list after a change)."""
    if request.htmx and request.GET.get("fragment") == fragment:
        return render(request, part, context)
    return render(request, page, context)


def dialog_done(request, event: str, fallback_url: str):
    """Close the dialog and tell the page what changed; without HTMX, go back to the list."""
    if request.htmx:
        response = HttpResponse(status=204)
        response["HX-Trigger"] = json.dumps({event: True, "closeDialog": True})
        return response
    return redirect(fallback_url)
