"""Spot-price refresh from AWS ``describe_spot_price_history`` (boto3), when credentials exist."""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from liveput.catalog import Catalog
from liveput.errors import LiveputError

log = logging.getLogger(__name__)


def latest_spot_prices(
    client: Any, instance_types: list[str], now: dt.datetime, product: str = "Linux/UNIX"
) -> dict[str, float]:
    """Cheapest current spot price of each type over the region's zones ($/h).

    ``now`` is injected: the query asks for prices in effect at that moment, one per zone.
    """
    newest: dict[tuple[str, str], tuple[dt.datetime, float]] = {}
    paginator = client.get_paginator("describe_spot_price_history")
    for page in paginator.paginate(
        InstanceTypes=instance_types, ProductDescriptions=[product], StartTime=now, EndTime=now
    ):
        for record in page.get("SpotPriceHistory", []):
            key = (record["InstanceType"], record.get("AvailabilityZone", ""))
            stamp = record["Timestamp"]
            if key not in newest or stamp > newest[key][0]:
                newest[key] = (stamp, float(record["SpotPrice"]))
    prices: dict[str, float] = {}
    for (name, _zone), (_stamp, price) in newest.items():
        prices[name] = min(price, prices.get(name, float("inf")))
    return prices


def refresh_spot_prices(
    catalog: Catalog, region: str, now: dt.datetime, client: Any | None = None
) -> Catalog:
    """``catalog`` with the spot prices AWS reports now in ``region``.

    Without AWS credentials this raises a one-line error; types AWS does not price keep theirs.
    """
    if client is None:
        import boto3

        session = boto3.Session(region_name=region)
        if session.get_credentials() is None:
            raise LiveputError(
                "--refresh-prices needs AWS credentials (environment, profile or "
                "instance role); none found"
            )
        client = session.client("ec2")
    prices = latest_spot_prices(client, [spec.name for spec in catalog.instances], now)
    log.info("refreshed %d of %d spot prices in %s", len(prices), len(catalog.instances), region)
    stamp = now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return catalog.with_spot_prices(
        prices, f"AWS describe_spot_price_history, {region}, cheapest zone, {stamp}"
    )
