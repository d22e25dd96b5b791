"""The project's URLs with the sites API mounted, as mado/api/urls.py will include it
(`path("", include("sites.api_urls"))`), so the API tests do not depend on that line."""
from django.urls import include, path

from mado.urls import urlpatterns as project_urlpatterns

urlpatterns = [path("api/", include("sites.api_urls")), *project_urlpatterns]
