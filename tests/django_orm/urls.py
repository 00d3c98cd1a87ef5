"""The shop's URLs and the suite's: ``/plain-orders`` is the shop's order view in
handler mode; ``/boom`` writes an order, then raises; ``/marked`` writes one and marks
the transaction for rollback; ``/slow`` writes one and takes a second to answer."""

import time

from django.db import transaction
from django.http import JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from orders.models import Order
from orders.views import create_order
from shop.urls import urlpatterns as shop_urls


@csrf_exempt
def boom(request):
    Order.objects.create(item="boom", quantity=1)
    raise RuntimeError("the view failed after its ORM write")


@csrf_exempt
def marked(request):
    Order.objects.create(item="marked", quantity=1)
    transaction.set_rollback(True)  # the view rolls its own request back
    return JsonResponse({"ok": True}, status=201)


@csrf_exempt
def slow(request):
    order = Order.objects.create(item="slow", quantity=1)
    time.sleep(1.0)  # holds the key's transaction open while a twin arrives
    return JsonResponse({"id": order.pk}, status=201)


urlpatterns = [
    *shop_urls,
    path("plain-orders", create_order),
    path("boom", boom),
    path("marked", marked),
    path("slow", slow),
]
