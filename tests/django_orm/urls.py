"""The shop's URLs and one the suite adds: ``/boom`` writes an order, then raises."""

from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from orders.models import Order
from shop.urls import urlpatterns as shop_urls


@csrf_exempt
def boom(request):
    Order.objects.create(item="boom", quantity=1)
    raise RuntimeError("the view failed after its ORM write")


urlpatterns = [*shop_urls, path("boom", boom)]
