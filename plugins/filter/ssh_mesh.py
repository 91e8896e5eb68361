"""Merge the host keys read from the nodes now with the keys recorded on the controller.

The controller keeps a record of every mesh member's host keys. A node whose keys differ from
the record is reported as re-keyed and keeps its recorded keys in known_hosts until the user
accepts the change; a node that cannot be reached now keeps its recorded entry, so a lost node
does not drop out of everybody's known_hosts.
"""

from __future__ import annotations

from typing import Any


def _key_set(keys: list[str]) -> list[str]:
    """Keys as sorted 'type base64' strings, comments dropped."""
    out = set()
    for key in keys:
        parts = str(key).split()
        if len(parts) >= 2:
            out.add(f"{parts[0]} {parts[1]}")
    return sorted(out)


def _aliases(entry: dict[str, Any]) -> list[str]:
    seen: list[str] = []
    for alias in entry.get("aliases", []):
        alias = str(alias).strip()
        if alias and alias not in seen:
            seen.append(alias)
    return seen


def ssh_mesh_merge(
    observed: list[dict[str, Any]],
    recorded: dict[str, Any] | None,
    members: list[str],
    accept: list[str] | None = None,
) -> dict[str, Any]:
    """Return {'hosts': {...}, 'rekeyed': {...}, 'missing': [...]} for the mesh members.

    observed: one {'name', 'aliases', 'keys'} per node that answered in this run.
    recorded: {'hosts': {name: {'aliases', 'keys'}}} as last written on the controller.
    members:  inventory names of the mesh group (its whole membership, not only this run's hosts).
    accept:   inventory names whose changed keys the user accepts.
    """
    old_hosts: dict[str, Any] = dict((recorded or {}).get("hosts") or {})
    accepted = set(accept or [])
    seen = {str(o["name"]): o for o in observed}
    hosts: dict[str, Any] = {}
    rekeyed: dict[str, Any] = {}
    missing: list[str] = []
    for name in sorted(set(members)):
        old = old_hosts.get(name)
        new = seen.get(name)
        if new is not None:
            entry = {"aliases": _aliases(new), "keys": _key_set(new.get("keys", []))}
            if not entry["keys"]:
                missing.append(name)
                if old is not None:
                    hosts[name] = old
                continue
            old_keys = _key_set(old.get("keys", [])) if old else []
            if old_keys and old_keys != entry["keys"] and name not in accepted:
                rekeyed[name] = {"recorded": old_keys, "found": entry["keys"]}
                hosts[name] = {"aliases": _aliases(old or {}), "keys": old_keys}
            else:
                hosts[name] = entry
        elif old is not None:
            hosts[name] = {"aliases": _aliases(old), "keys": _key_set(old.get("keys", []))}
        else:
            missing.append(name)
    return {"hosts": hosts, "rekeyed": rekeyed, "missing": missing}


def ssh_mesh_known_hosts(hosts: dict[str, Any]) -> list[str]:
    """known_hosts lines, one per host key, in a stable order."""
    lines = []
    for name in sorted(hosts):
        entry = hosts[name]
        patterns = ",".join(_aliases(entry))
        lines.extend(f"{patterns} {key}" for key in _key_set(entry.get("keys", [])))
    return lines


class FilterModule:
    """ssh_mesh filters."""

    def filters(self) -> dict[str, Any]:
        return {
            "ssh_mesh_merge": ssh_mesh_merge,
            "ssh_mesh_known_hosts": ssh_mesh_known_hosts,
        }
