"""The AWS provider against moto running as a real server: request -> instance -> agent joins ->
trains -> release, and the provider's calls, errors and retries through botocore."""

from __future__ import annotations

import base64
import datetime as dt
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from moto_support import DUMMY_CREDENTIALS, MotoInstanceRunner, moto_endpoint, reset_moto

from liveput.catalog import load_catalog
from liveput.cloud import InstanceState, Market, ProviderEventKind, RetryPolicy
from liveput.cloud.aws import AwsConfig, AwsProvider
from liveput.cloud.userdata import AgentBoot, agent_user_data, parse_agent_command
from liveput.errors import LiveputError
from liveput.models.jobs import resolve_job
from liveput.runtime.clock import ManualClock
from liveput.runtime.coordinator import Coordinator, CoordinatorConfig
from liveput.runtime.launch import JobSpec, publish_spec
from liveput.runtime.ledger import verify_ledger
from liveput.runtime.planning import profile_job
from liveput.runtime.store import SignedStore, TCPStoreBackend
from liveput.testbed.aws_endpoint import server_stacks

TOKEN = "moto-test-token"
JOB = "tiny-gpt-small"
FAST = RetryPolicy(max_attempts=3, base_delay_s=1.0)


@pytest.fixture(scope="module")
def moto_server(tmp_path_factory: pytest.TempPathFactory, process_tier: None) -> Iterator[str]:
    with moto_endpoint(tmp_path_factory.mktemp("moto") / "moto.log") as url:
        yield url


@pytest.fixture
def moto(moto_server: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh moto account, with dummy credentials in the environment (boto3's chain)."""
    reset_moto(moto_server)
    for name, value in DUMMY_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return moto_server


def provider_for(
    moto: str,
    clock: ManualClock,
    *,
    coordinator: str = "10.0.0.1:29400",
    use_fleet: bool = True,
    notices: str = "aws,sigterm",
) -> AwsProvider:
    return AwsProvider(
        AwsConfig(
            region="us-east-1",
            instance_types=("c5.xlarge", "m6i.xlarge"),
            job="test",
            boot=AgentBoot(coordinator, TOKEN, notices=notices),
            endpoint_url=moto,
            use_fleet=use_fleet,
            retry=FAST,
        ),
        clock,
    )


def described(provider: AwsProvider, ids: list[str]) -> dict[str, dict]:
    answer = provider.client.describe_instances(InstanceIds=ids)
    return {i["InstanceId"]: i for r in answer["Reservations"] for i in r["Instances"]}


def test_request_boot_join_train_release_and_bill(moto: str, tmp_path: Path) -> None:
    started = time.monotonic()
    hosted = TCPStoreBackend("127.0.0.1", 0, host=True)
    store = SignedStore(hosted, TOKEN)
    publish_spec(store, JobSpec(JOB, str(tmp_path / "ckpt"), checkpoint_every=3))
    clock = ManualClock(0.0)
    provider = provider_for(moto, clock, coordinator=hosted.url, notices="sigterm")
    runner = MotoInstanceRunner(provider, tmp_path)
    try:
        spot = provider.request(2, ["c5.xlarge", "m6i.xlarge"], "spot")
        on_demand = provider.request(1, "c5.xlarge", Market.ON_DEMAND)
        assert (len(spot.granted), spot.failed, len(on_demand.granted)) == (2, 0, 1)
        ids = spot.instance_ids + on_demand.instance_ids
        in_moto = described(provider, ids)
        assert {i: in_moto[i].get("InstanceLifecycle") for i in ids} == {
            **dict.fromkeys(spot.instance_ids, "spot"),
            on_demand.instance_ids[0]: None,
        }
        assert all({"Key": "liveput-job", "Value": "test"} in in_moto[i]["Tags"] for i in ids)

        runner.sync()  # moto runs them at once: one agent each, from the instance's user data
        assert set(runner.processes) == set(ids)
        assert all(
            argv[1:4] == ["agent", "--store", hosted.url] for argv in runner.commands.values()
        )
        assert all(
            r.state is InstanceState.RUNNING and r.launch_s == 0.0 for r in provider.instances()
        )

        job = resolve_job(JOB)
        coordinator = Coordinator(
            store,
            profile_job(job, repeats=1),
            CoordinatorConfig(
                num_steps=12,
                num_micro_batches=job.num_micro_batches,
                capacity=3,
                initial_workers=3,
                interval_s=1.0,
                tick_s=0.05,
                heartbeat_timeout_s=3.0,
                start_grace_s=60.0,
            ),
        )
        deadline = time.monotonic() + 90
        joined: set[int] = set()
        released = spot.instance_ids[0]
        while coordinator.tick():
            joined |= set(coordinator.available)
            if coordinator.committed >= 3 and clock.now_s() == 0.0:
                clock.set(1800.0)  # half an hour in: give one spot instance back mid-training
                assert provider.release([released]) == [released]
                runner.sync()  # its agent gets SIGTERM (a notice) and leaves the job
            assert time.monotonic() < deadline, {i: runner.log(i)[-800:] for i in ids}
            time.sleep(coordinator.config.tick_s)
        assert clock.now_s() == 1800.0, "the job ended before the release"
        assert len(joined) == 3, joined  # every instance's agent joined the job
        assert runner.processes[released].wait(timeout=30) is not None
        report = verify_ledger(store, job.global_batch_size, 12)
        assert report.steps_applied == 12 and report.exactly_once  # trained on without it

        markets = [json.loads(v).get("market") for v in store.get_prefix("members/").values()]
        assert markets.count("on-demand") == 1 and "spot" in markets, markets

        clock.set(3600.0)  # an hour on the provider's clock: the bill is exact
        rest = [i for i in ids if i != released]
        assert sorted(provider.release(ids)) == sorted(rest)
        runner.sync()
        for process in runner.processes.values():
            assert process.wait(timeout=30) is not None
        states = {i: d["State"]["Name"] for i, d in described(provider, ids).items()}
        assert set(states.values()) <= {"shutting-down", "terminated"}, states
        assert all(
            r.state is InstanceState.TERMINATED and not r.preempted for r in provider.instances()
        )
        assert {r.instance_id: r.end_s for r in provider.instances()} == {
            **dict.fromkeys(rest, 3600.0),
            released: 1800.0,
        }

        bill = provider.bill()
        hours = {released: 0.5}
        spot_usd = sum(
            provider.prices(r.instance_type, [r.zone])[0].spot_usd_per_hour
            * hours.get(r.instance_id, 1.0)
            for r in spot.granted
        )
        assert bill.usd_spot == pytest.approx(spot_usd, rel=1e-12)
        assert bill.usd_on_demand == pytest.approx(
            load_catalog("aws").get("c5.xlarge").on_demand_usd_per_hour, rel=1e-12
        )
        assert bill.on_demand_hours == pytest.approx(1.0) and bill.spot_hours == pytest.approx(1.5)
    finally:
        runner.close()
        store.close()
    assert time.monotonic() - started < 120


def test_the_launch_template_boots_liveput_agent_with_the_coordinator_and_token(moto: str) -> None:
    provider = provider_for(moto, ManualClock())
    template = provider.launch_template_id()
    versions = provider.client.describe_launch_template_versions(LaunchTemplateId=template)
    data = versions["LaunchTemplateVersions"][0]["LaunchTemplateData"]
    script = base64.b64decode(data["UserData"]).decode()
    assert script == agent_user_data(
        AgentBoot("10.0.0.1:29400", TOKEN, token_parameter="/liveput/test/token")
    )
    assert "pip install --quiet liveput==" in script
    command = parse_agent_command(script)
    assert command.argv[1:] == [
        "agent",
        "--coordinator",
        "10.0.0.1:29400",
        "--host",
        "${LIVEPUT_HOST}",
        "--notices",
        "aws,sigterm",
    ]
    assert command.env == {"LIVEPUT_TOKEN_PARAMETER": "/liveput/test/token"}
    assert TOKEN not in script
    assert '--name "$LIVEPUT_TOKEN_PARAMETER" --with-decryption' in script
    assert "aws ssm get-parameter" in script and "export LIVEPUT_TOKEN\n" in script
    assert "meta-data/instance-life-cycle" in script and "export LIVEPUT_MARKET" in script
    assert data["ImageId"].startswith("ami-")  # the SSM default image
    assert provider.launch_template_id() == template  # made once per provider
    again = provider_for(moto, ManualClock())
    assert again.launch_template_id() == template  # a new provider reuses it (a new version)


@pytest.mark.parametrize("market", ["spot", "on-demand"])
def test_run_instances_path(moto: str, market: str) -> None:
    provider = provider_for(moto, ManualClock(), use_fleet=False)
    result = provider.request(2, "m6i.xlarge", market, ["us-east-1b"])
    assert len(result.granted) == 2
    in_moto = described(provider, result.instance_ids)
    lifecycle = "spot" if market == "spot" else None
    assert all(
        i.get("InstanceLifecycle") == lifecycle
        and i["InstanceType"] == "m6i.xlarge"
        and i["Placement"]["AvailabilityZone"] == "us-east-1b"
        for i in in_moto.values()
    )


def test_an_instance_gone_without_a_release_counts_as_preempted(moto: str) -> None:
    clock = ManualClock(0.0)
    provider = provider_for(moto, clock)
    (record,) = provider.request(1, "c5.xlarge", "spot").granted
    provider.instances()
    clock.set(600.0)
    provider.client.terminate_instances(InstanceIds=[record.instance_id])  # the cloud's doing
    (seen,) = provider.instances()
    assert seen.preempted and seen.end_s == 600.0 and seen.state is InstanceState.TERMINATED


def test_an_unreachable_endpoint_is_retried_with_backoff_then_one_line(moto: str) -> None:
    clock = ManualClock(0.0)
    provider = AwsProvider(
        AwsConfig(
            region="us-east-1",
            instance_types=("c5.xlarge",),
            boot=AgentBoot("h:1", TOKEN),
            endpoint_url="http://127.0.0.1:9",
            subnets={"us-east-1a": "subnet-1"},
            image_id="ami-12345678",
            retry=RetryPolicy(max_attempts=3, base_delay_s=2.0),
        ),
        clock,
    )
    with pytest.raises(
        LiveputError,
        match=r"^aws: launch template failed after 3 attempt\(s\): "
        r"EndpointConnectionError: ",
    ):
        provider.request(1, "c5.xlarge", "spot")
    assert clock.now_s() == 2.0 + 4.0
    assert [e.kind for e in provider.events].count(ProviderEventKind.RETRY) == 2


def test_a_reset_that_goes_unanswered_says_where_the_servers_threads_were(moto: str) -> None:
    stacks = server_stacks(moto)
    assert "(most recent call first)" in stacks and "werkzeug/serving.py" in stacks
    with socket.socket() as silent:  # accepts connections (its backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(AssertionError, match=r"did not answer in 0.2 s; the server's threads"):
            reset_moto(url, timeout_s=0.2)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"region": "us-moon-1"}, "unknown AWS region 'us-moon-1'; known: "),
        (
            {"instance_types": ("c5.xlarge", "z9.huge")},
            "unknown instance type 'z9.huge' in catalog",
        ),
        ({"instance_types": ()}, "aws: give at least one instance type"),
    ],
)
def test_bad_configuration_is_one_line(moto: str, change: dict, message: str) -> None:
    settings = {
        "region": "us-east-1",
        "instance_types": ("c5.xlarge",),
        "boot": AgentBoot("h:1", TOKEN),
        "endpoint_url": moto,
        **change,
    }
    with pytest.raises(LiveputError, match=message) as raised:
        AwsProvider(AwsConfig(**settings), ManualClock())
    assert "\n" not in str(raised.value)


def test_no_credentials_is_one_line(moto: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name)
    with pytest.raises(LiveputError, match="^aws: no AWS credentials found"):
        provider_for(moto, ManualClock())


def test_zones_are_the_default_subnets_and_unknown_zones_are_refused(moto: str) -> None:
    provider = provider_for(moto, ManualClock())
    assert "us-east-1a" in provider.zones and all(
        s.startswith("subnet-") for s in provider.subnets.values()
    )
    with pytest.raises(LiveputError, match="aws: unknown zone.s. us-east-9z"):
        provider.request(1, "c5.xlarge", "spot", ["us-east-9z"])


def test_the_token_is_a_secure_parameter_while_the_provider_runs_never_user_data(
    moto: str,
) -> None:
    """User data is readable with ec2:DescribeInstanceAttribute: it carries only the name of
    the SSM SecureString the instance reads the token from; closing the provider deletes it."""
    provider = provider_for(moto, ManualClock())
    ssm = provider.session.client("ssm", endpoint_url=moto, region_name="us-east-1")
    (record,) = provider.request(1, "c5.xlarge", "spot").granted
    answer = provider.client.describe_instance_attribute(
        InstanceId=record.instance_id, Attribute="userData"
    )
    user_data = base64.b64decode(answer["UserData"]["Value"]).decode()
    assert TOKEN not in user_data and "/liveput/test/token" in user_data
    assert provider.token_parameter == "/liveput/test/token"
    parameter = ssm.get_parameter(Name="/liveput/test/token", WithDecryption=True)["Parameter"]
    assert parameter["Type"] == "SecureString" and parameter["Value"] == TOKEN
    hidden = ssm.get_parameter(Name="/liveput/test/token")["Parameter"]
    assert hidden["Value"] != TOKEN  # encrypted unless decryption is asked (and allowed)
    provider.release([record.instance_id])
    provider.close()
    with pytest.raises(ssm.exceptions.ParameterNotFound):
        ssm.get_parameter(Name="/liveput/test/token", WithDecryption=True)
    provider.close()  # twice is fine
    assert provider.bill().spot_hours == 0.0  # the CLI bills after closing


def test_the_bill_runs_from_the_launch_time_ec2_reports(moto: str) -> None:
    """The provider first lists the instance 10 minutes after it launched: AWS bills from
    LaunchTime, and so does the provider (it billed from its first sight, 10 minutes less)."""
    clock = ManualClock(0.0)
    base = dt.datetime.now(dt.UTC)
    provider = AwsProvider(
        provider_for(moto, clock).config,
        clock,
        now_utc=lambda: base + dt.timedelta(seconds=clock.now_s()),
    )
    (record,) = provider.request(1, "c5.xlarge", "on-demand").granted
    clock.set(600.0)
    (seen,) = provider.instances()
    launch_time = described(provider, [record.instance_id])[record.instance_id]["LaunchTime"]
    expected_s = min(600.0, max(0.0, (launch_time - base).total_seconds()))
    assert seen.launch_s == pytest.approx(expected_s) and seen.launch_s < 60.0  # not 600
    clock.set(3600.0)
    assert provider.bill().on_demand_hours == pytest.approx(1.0 - expected_s / 3600)


def test_a_token_parameter_name_must_be_an_ssm_name() -> None:
    with pytest.raises(LiveputError, match="token parameter 'liveput token' must be an SSM"):
        AgentBoot("h:1", TOKEN, token_parameter="liveput token")


def test_the_newest_spot_price_of_each_zone_asked_is_taken():
    import datetime as dt

    from liveput.cloud.aws_template import newest_spot_prices

    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    answer = {
        "SpotPriceHistory": [
            {"AvailabilityZone": "a", "Timestamp": t0, "SpotPrice": "0.5"},
            {
                "AvailabilityZone": "a",
                "Timestamp": t0 + dt.timedelta(minutes=5),
                "SpotPrice": "0.7",
            },
            {"AvailabilityZone": "b", "Timestamp": t0, "SpotPrice": "0.9"},
            {"AvailabilityZone": "c", "Timestamp": t0, "SpotPrice": "0.1"},
        ]
    }
    assert newest_spot_prices(answer, ("a", "b", "d")) == {"a": 0.7, "b": 0.9}
