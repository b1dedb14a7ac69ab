"""Instance catalogs: package data with sources, DeepVM's format as is, errors, price refresh."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from liveput.advise import Market, load_catalog
from liveput.advise.prices import refresh_spot_prices
from liveput.errors import LiveputError

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "profiles"


def test_builtin_catalog_covers_required_types_and_names_a_source_for_every_figure() -> None:
    catalog = load_catalog("aws")
    names = {spec.name for spec in catalog.instances}
    required = {
        "g3s.xlarge",
        "g4dn.xlarge",
        "g5.xlarge",
        "p3.2xlarge",
        "p2.8xlarge",
        "g4dn.12xlarge",
        "g4dn.4xlarge",
        "g3.16xlarge",
        "g3.8xlarge",
        "g3.4xlarge",
        "g5.12xlarge",
        "p4d.24xlarge",
        "p5.48xlarge",
        "c5.xlarge",
        "t3.xlarge",
        "c6in.xlarge",
    }
    assert required <= names
    gpus = {spec.gpu for spec in catalog.gpu_types}
    assert {"A10G", "A100", "H100", "T4", "V100"} <= gpus
    assert catalog.cpu_types, "CPU types for checkpoint nodes"
    for spec in catalog.instances:
        keys = {"specs", "ondemand_price", "spot_price"} | ({"flops"} if spec.is_gpu else set())
        assert keys <= set(spec.sources), spec.name
        for source in spec.sources.values():
            assert source in catalog.sources, (spec.name, source)
    # Every source says when: a year or a month.
    assert all(
        any(str(year) in text for year in range(2020, 2027)) for text in catalog.sources.values()
    )


def test_spotdnn_prices_match_the_published_table() -> None:
    catalog = load_catalog("aws")
    published = {
        "p3.2xlarge": (1.25, 3.06),
        "p2.8xlarge": (2.16, 7.20),
        "g4dn.12xlarge": (1.22, 3.91),
        "g4dn.4xlarge": (0.36, 1.20),
        "g3.16xlarge": (1.37, 4.56),
        "g3.8xlarge": (0.69, 2.28),
        "g3.4xlarge": (0.34, 1.14),
    }
    for name, (spot, on_demand) in published.items():
        spec = catalog.get(name)
        assert (spec.spot_usd_per_hour, spec.on_demand_usd_per_hour) == (spot, on_demand)


def test_deepvm_catalog_is_read_as_is() -> None:
    mine = load_catalog(REFERENCE / "deepvm_aws_catalog.json")
    shipped = load_catalog("deepvm-aws")
    assert [s.name for s in mine.instances] == [s.name for s in shipped.instances]
    g4dn = mine.get("g4dn.xlarge")
    assert (g4dn.spot_usd_per_hour, g4dn.relative_flops, g4dn.gpus) == (0.1578, 377.0, 1)
    assert not mine.get("t3.xlarge").is_gpu
    assert mine.quota_vcpus("G", Market.SPOT) == 128
    assert mine.max_count(g4dn, Market.ON_DEMAND) == 8


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{", "invalid JSON"),
        ('{"instances": 3}', "'instances' list"),
        ('{"instances": [{"name": "x", "type": "G"}]}', "missing field 'vCPU'"),
        (
            '{"instances": [{"name": "x", "vCPU": 4, "memory": 1, "network_bandwidth": 1, '
            '"ondemand_price": "a", "spot_price": 1}]}',
            "must be a number",
        ),
        (
            '{"instances": [{"name": "x", "vCPU": 4, "memory": 1, "network_bandwidth": 1, '
            '"ondemand_price": 1, "spot_price": 0}]}',
            "prices must be > 0",
        ),
    ],
)
def test_bad_catalogs_get_one_line_errors(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "catalog.json"
    path.write_text(content)
    with pytest.raises(LiveputError, match=message) as error:
        load_catalog(path)
    assert "\n" not in str(error.value)


def test_duplicate_and_unknown_types_are_reported(tmp_path: Path) -> None:
    data = json.loads((REFERENCE / "deepvm_aws_catalog.json").read_text())
    data["instances"].append(data["instances"][0])
    path = tmp_path / "dup.json"
    path.write_text(json.dumps(data))
    with pytest.raises(LiveputError, match="duplicated instance types"):
        load_catalog(path)
    with pytest.raises(LiveputError, match="unknown instance type 'h200.huge'"):
        load_catalog("aws").get("h200.huge")
    with pytest.raises(LiveputError, match="no such file"):
        load_catalog(tmp_path / "missing.json")


def test_spot_prices_refresh_from_describe_spot_price_history(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    catalog = load_catalog("aws")
    now = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)
    with mock_aws():
        client = boto3.client("ec2", region_name="us-east-1")
        reported = {
            r["InstanceType"]
            for r in client.describe_spot_price_history(
                InstanceTypes=[s.name for s in catalog.instances]
            )["SpotPriceHistory"]
        }
        refreshed = refresh_spot_prices(catalog, "us-east-1", now)
    assert reported, "the mocked region prices some of the catalog's types"
    for before, after in zip(catalog.instances, refreshed.instances):
        if before.name in reported:
            assert after.spot_usd_per_hour != before.spot_usd_per_hour
            assert after.sources["spot_price"] == "refresh"
        else:
            assert after.spot_usd_per_hour == before.spot_usd_per_hour
        assert after.on_demand_usd_per_hour == before.on_demand_usd_per_hour
    assert "us-east-1" in refreshed.sources["refresh"]
    assert "2026-11-22T12:00:00Z" in refreshed.sources["refresh"]


def test_refresh_without_credentials_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(LiveputError, match="needs AWS credentials"):
        refresh_spot_prices(load_catalog("aws"), "us-east-1", dt.datetime.now(dt.UTC))


def test_one_market_keeps_deepvms_ondemand_in_catalog_files_and_plans(tmp_path: Path) -> None:
    """The one Market says ``on-demand`` (the clouds' and the agents' word); catalog files and
    advise plans keep ``ondemand``, read and written through :attr:`Market.catalog_name`."""
    from liveput.advise.plans import InstanceCount, Plan
    from liveput.cloud import Market as CloudMarket

    assert CloudMarket is Market
    assert [m.value for m in Market] == ["spot", "on-demand"]
    assert Market.parse("ondemand") is Market.parse(" On-Demand ") is Market.ON_DEMAND
    assert Market.parse("spot") is Market.SPOT
    with pytest.raises(LiveputError, match="unknown market 'reserved'"):
        Market.parse("reserved")
    path = tmp_path / "quota.json"
    path.write_text(
        json.dumps(
            {
                "instances": [
                    {
                        "name": "x1",
                        "type": "X",
                        "vCPU": 4,
                        "memory": 16,
                        "network_bandwidth": 10,
                        "ondemand_price": 1.0,
                        "spot_price": 0.3,
                    }
                ],
                "available_vcpus": {"X": {"ondemand": 8, "spot": 32}},
            }
        )
    )
    catalog = load_catalog(path)
    assert catalog.quota_vcpus("X", Market.ON_DEMAND) == 8
    assert catalog.quota_vcpus("X", Market.SPOT) == 32
    plan = Plan(
        "test",
        (InstanceCount("x1", 2, Market.SPOT), InstanceCount("x1", 1, Market.ON_DEMAND)),
        1.3,
        "cost_usd",
        1.3,
    )
    assert plan.describe() == "2 x x1 spot + 1 x x1 ondemand"
    assert [item["market"] for item in plan.to_dict()["instances"]] == ["spot", "ondemand"]
