"""The AWS provider's launch template and spot prices, as pure functions of its settings and of
EC2's answers (:mod:`liveput.cloud.aws` makes the calls)."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

from liveput.cloud.retry import ProviderError
from liveput.cloud.userdata import AgentBoot, agent_user_data

Call = Callable[..., dict[str, Any]]
"""``call(operation, **kwargs)``: one EC2 call, EC2's answer (a :class:`ProviderError` if not)."""


def launch_template_data(
    boot: AgentBoot,
    image_id: str,
    tags: list[dict[str, str]],
    security_group_ids: tuple[str, ...] = (),
    key_name: str | None = None,
    instance_profile: str | None = None,
) -> dict[str, Any]:
    """The ``LaunchTemplateData`` of a job's instances: its image, the user data that boots the
    agent (``boot``), the job's tags, IMDSv2 only, and the optional network, key and role."""
    data: dict[str, Any] = {
        "ImageId": image_id,
        "UserData": base64.b64encode(agent_user_data(boot).encode()).decode(),
        "TagSpecifications": [{"ResourceType": "instance", "Tags": tags}],
        "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
    }
    if security_group_ids:
        data["SecurityGroupIds"] = list(security_group_ids)
    if key_name:
        data["KeyName"] = key_name
    if instance_profile:
        data["IamInstanceProfile"] = {"Name": instance_profile}
    return data


def ensure_launch_template(call: Call, name: str, data: dict[str, Any]) -> str:
    """The id of launch template ``name`` holding ``data``: made, or given a new default version
    with it."""
    try:
        found = call("describe_launch_templates", LaunchTemplateNames=[name])
    except ProviderError as error:
        if "NotFound" not in error.code:
            raise
        made = call("create_launch_template", LaunchTemplateName=name, LaunchTemplateData=data)
        return str(made["LaunchTemplate"]["LaunchTemplateId"])
    template_id = str(found["LaunchTemplates"][0]["LaunchTemplateId"])
    version = call(
        "create_launch_template_version", LaunchTemplateId=template_id, LaunchTemplateData=data
    )
    number = str(version["LaunchTemplateVersion"]["VersionNumber"])
    call("modify_launch_template", LaunchTemplateId=template_id, DefaultVersion=number)
    return template_id


def newest_spot_prices(answer: dict[str, Any], zones: tuple[str, ...]) -> dict[str, float]:
    """Zone -> the newest spot price of ``describe_spot_price_history``'s ``answer`` in each of
    ``zones`` (a zone without one is left out)."""
    newest: dict[str, tuple[Any, float]] = {}
    for entry in answer.get("SpotPriceHistory", []):
        zone = entry.get("AvailabilityZone", "")
        stamp = entry.get("Timestamp")
        if zone in zones and (zone not in newest or stamp > newest[zone][0]):
            newest[zone] = (stamp, float(entry["SpotPrice"]))
    return {zone: price for zone, (_, price) in newest.items()}
