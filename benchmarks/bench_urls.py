"""crm.urls plus `/bench/trivial`: a view that reads the body and answers a small JSON object,
through the same middleware as every other view."""

from django.http import HttpRequest, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from crm.urls import urlpatterns as project_urls


@csrf_exempt
def trivial(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True, "bytes": len(request.body)})


urlpatterns = [path("bench/trivial", trivial), *project_urls]
