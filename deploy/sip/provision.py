"""Create the inbound SIP trunk and the dispatch rules of deploy/sip/ on a LiveKit server, with
livekit-api (LiveKit's SIP API, served by the LiveKit server once its SIP service is attached
through Redis).

The trunk's own rule (each caller in a room of their own, the agent dispatched there), and on
request (`--refuse-rule`) a catch-all for calls that no trunk accepts (`refuse-rule.json`).
Without it LiveKit sends such a call 180 Ringing and then nothing, on purpose (SIP scanners
learn nothing, and a flood of INVITEs costs LiveKit next to nothing), so a misdialled caller's
phone rings until it gives up by itself; with it the call goes to a room of its own, the agent
logs one line naming the caller, the number called and the reason, and deletes the room, and
LiveKit SIP answers the phone `486 Busy Here` (agent/phone.py, `refuse_call`). But then every
INVITE from anyone on the internet becomes a room on the LiveKit server and an offer to the
agent (which refuses at most AGENT_SIP_REFUSALS_PER_S a second; docs/sip.md), so it is off
unless asked for: worth it where the SIP port only hears the provider (a firewall), or on a
private network.

    python -m deploy.sip.provision                      # LIVEKIT_URL / LIVEKIT_API_KEY / LIVEKIT_API_SECRET
    python -m deploy.sip.provision --replace            # delete trunks and rules of the same names first
    python -m deploy.sip.provision --allowed-address 127.0.0.1/32   # local phones instead of the provider's
    python -m deploy.sip.provision --refuse-rule        # calls no trunk accepts: a busy, from the agent

`scripts/dev --sip` and the phone tests call `provision()` with the loopback overrides and the
refuse rule: the trunk accepts calls from 127.0.0.1 for the trunk's number, the rule dispatches
the named agent into each caller's room, and other calls get a busy. Prints the ids it created.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import json_format
from livekit import api
from livekit.protocol import sip


HERE = Path(__file__).resolve().parent  # deploy/sip/: the trunk and the rules beside this file
TRUNK_FILE = HERE / "inbound-trunk.json"
RULE_FILE = HERE / "dispatch-rule.json"
REFUSE_RULE_FILE = HERE / "refuse-rule.json"


@dataclass
class Provisioned:
    trunk_id: str
    rule_id: str
    numbers: list[str]
    agent_names: list[str]
    refuse_rule_id: str | None = None


def trunk_request(path: Path = TRUNK_FILE, *, allowed_addresses: list[str] | None = None,
                  numbers: list[str] | None = None) -> sip.CreateSIPInboundTrunkRequest:
    """The trunk file as LiveKit's request; the overrides replace the file's values."""
    request = json_format.ParseDict(json.loads(path.read_text()), sip.CreateSIPInboundTrunkRequest())
    if allowed_addresses is not None:
        del request.trunk.allowed_addresses[:]
        request.trunk.allowed_addresses.extend(allowed_addresses)
    if numbers is not None:
        del request.trunk.numbers[:]
        request.trunk.numbers.extend(numbers)
    return request


def rule_request(path: Path = RULE_FILE, *, agent_name: str | None = None,
                 trunk_ids: list[str] | None = None) -> sip.CreateSIPDispatchRuleRequest:
    """The rule file as LiveKit's request. `agent_name`: the agent dispatched into each room
    (replacing the file's); `trunk_ids`: the rule applies to calls of those trunks only."""
    request = json_format.ParseDict(json.loads(path.read_text()), sip.CreateSIPDispatchRuleRequest())
    if agent_name is not None:
        agents = request.dispatch_rule.room_config.agents
        del agents[:]
        agents.add(agent_name=agent_name)
    if trunk_ids is not None:
        del request.dispatch_rule.trunk_ids[:]
        request.dispatch_rule.trunk_ids.extend(trunk_ids)
    return request


def refuse_rule_request(path: Path = REFUSE_RULE_FILE, *,
                        agent_name: str | None = None) -> sip.CreateSIPDispatchRuleRequest:
    """The catch-all rule for calls no trunk accepts (no trunk ids: LiveKit uses it only when
    no rule of a matching trunk applies); `agent_name`: the agent that refuses them, with the
    file's job metadata (the reason it logs)."""
    request = json_format.ParseDict(json.loads(path.read_text()), sip.CreateSIPDispatchRuleRequest())
    agents = request.dispatch_rule.room_config.agents
    if len(agents) != 1 or "refuse" not in json.loads(agents[0].metadata or "{}"):
        raise ValueError(f"{path}: expected one agent whose metadata is {{\"refuse\": \"<reason>\"}}")
    if request.dispatch_rule.trunk_ids:
        raise ValueError(f"{path}: the refusing rule must name no trunk (it is for calls no trunk accepts)")
    if agent_name is not None:
        agents[0].agent_name = agent_name
    return request


async def provision(lk: api.LiveKitAPI, *, trunk: sip.CreateSIPInboundTrunkRequest,
                    rule: sip.CreateSIPDispatchRuleRequest,
                    refuse_rule: sip.CreateSIPDispatchRuleRequest | None = None,
                    retired_rules: Collection[str] = (), replace: bool = False) -> Provisioned:
    """Create the trunk, then the rule bound to it, then `refuse_rule` (the catch-all) if given.
    `replace`: first delete the trunks and rules that carry the same names (so running it again
    does not leave two that match a call), and the rules named in `retired_rules` (a catch-all
    an earlier run created and this one does not want)."""
    if replace:
        trunks = await lk.sip.list_inbound_trunk(sip.ListSIPInboundTrunkRequest())
        for old in trunks.items:
            if old.name == trunk.trunk.name:
                await lk.sip.delete_trunk(sip.DeleteSIPTrunkRequest(sip_trunk_id=old.sip_trunk_id))
        names = {rule.dispatch_rule.name, *retired_rules} | ({refuse_rule.dispatch_rule.name} if refuse_rule else set())
        rules = await lk.sip.list_dispatch_rule(sip.ListSIPDispatchRuleRequest())
        for old_rule in rules.items:
            if old_rule.name in names:
                await lk.sip.delete_dispatch_rule(
                    sip.DeleteSIPDispatchRuleRequest(sip_dispatch_rule_id=old_rule.sip_dispatch_rule_id))
    created = await lk.sip.create_inbound_trunk(trunk)
    if not rule.dispatch_rule.trunk_ids:
        rule.dispatch_rule.trunk_ids.append(created.sip_trunk_id)
    created_rule = await lk.sip.create_dispatch_rule(rule)
    refuse_rule_id = None
    if refuse_rule is not None:
        refuse_rule_id = (await lk.sip.create_dispatch_rule(refuse_rule)).sip_dispatch_rule_id
    return Provisioned(trunk_id=created.sip_trunk_id, rule_id=created_rule.sip_dispatch_rule_id,
                       numbers=list(created.numbers),
                       agent_names=[a.agent_name for a in created_rule.room_config.agents],
                       refuse_rule_id=refuse_rule_id)


async def provision_at(url: str, api_key: str, api_secret: str, **kwargs) -> Provisioned:  # noqa: ANN003
    async with api.LiveKitAPI(url, api_key, api_secret) as lk:
        return await provision(lk, **kwargs)


def http_url(livekit_url: str) -> str:
    """livekit-api speaks HTTP(S) to the server: ws://host → http://host."""
    return livekit_url.replace("wss://", "https://", 1).replace("ws://", "http://", 1)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m deploy.sip.provision", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trunk", type=Path, default=TRUNK_FILE, help="CreateSIPInboundTrunkRequest as JSON")
    p.add_argument("--rule", type=Path, default=RULE_FILE, help="CreateSIPDispatchRuleRequest as JSON")
    p.add_argument("--allowed-address", action="append", dest="allowed_addresses",
                   help="accept calls from this address or CIDR only (repeat; replaces the file's)")
    p.add_argument("--number", action="append", dest="numbers", help="the trunk's number (repeat; replaces the file's)")
    p.add_argument("--agent-name", help="the agent dispatched into each caller's room (replaces the file's)")
    refuse = p.add_mutually_exclusive_group()
    refuse.add_argument("--refuse-rule", action="store_true",
                        help="also create the catch-all rule: calls no trunk accepts get a busy from the agent, at "
                             "the price of a room per INVITE from anywhere (docs/sip.md)")
    refuse.add_argument("--no-refuse-rule", dest="refuse_rule", action="store_false",
                        help="no catch-all (the default): LiveKit drops calls no trunk accepts without a final answer")
    p.add_argument("--refuse-rule-file", type=Path, default=REFUSE_RULE_FILE,
                   help="the catch-all rule's request (CreateSIPDispatchRuleRequest) for --refuse-rule")
    p.add_argument("--replace", action="store_true",
                   help="delete trunks and rules of the same names first (the catch-all's too, also without "
                        "--refuse-rule: one left from an earlier run would go on refusing)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    missing = [name for name in ("LIVEKIT_URL", "LIVEKIT_API_KEY", "LIVEKIT_API_SECRET") if not os.environ.get(name)]
    if missing:
        print(f"deploy.sip.provision: set {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        trunk = trunk_request(args.trunk, allowed_addresses=args.allowed_addresses, numbers=args.numbers)
        rule = rule_request(args.rule, agent_name=args.agent_name)
        refuse_rule = refuse_rule_request(args.refuse_rule_file, agent_name=args.agent_name)
    except (OSError, ValueError, json_format.ParseError) as e:
        print(f"deploy.sip.provision: bad request file: {e}", file=sys.stderr)
        return 2
    try:
        done = asyncio.run(provision_at(http_url(os.environ["LIVEKIT_URL"]), os.environ["LIVEKIT_API_KEY"],
                                        os.environ["LIVEKIT_API_SECRET"], trunk=trunk, rule=rule,
                                        refuse_rule=refuse_rule if args.refuse_rule else None,
                                        retired_rules=() if args.refuse_rule else (refuse_rule.dispatch_rule.name,),
                                        replace=args.replace))
    except api.TwirpError as e:
        print(f"deploy.sip.provision: the LiveKit server refused: {e.code}: {e.message}"
              " (is its SIP service attached through Redis?)", file=sys.stderr)
        return 1
    print(f"inbound trunk {done.trunk_id} for {', '.join(done.numbers) or 'any number'}; "
          f"dispatch rule {done.rule_id} → agent {', '.join(done.agent_names) or '(automatic dispatch)'}; "
          + (f"calls no trunk accepts: refused by the agent (rule {done.refuse_rule_id})" if done.refuse_rule_id
             else "calls no trunk accepts: dropped by LiveKit (no final answer)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
