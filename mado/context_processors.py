from mado import access


def navigation(request):
    """The project switcher's choices and the current project, for base.html."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    match = getattr(request, "resolver_match", None)
    current = match.kwargs.get("project") if match else None
    return {"nav_projects": list(access.projects_visible_to(user).only("slug", "name")), "nav_project_slug": current}
