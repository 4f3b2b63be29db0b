"""Assertions on the manifests `helm template` rendered for one value set (run by scripts/test helm).

    check_rendered.py SET RENDERED.yaml VALUES.yaml DOCKERFILE

Every check is named as a sentence about the chart's behaviour; the first failing one is
printed with what was found. Checks that hold for every value set run always; a few more run
for the set they concern. Needs PyYAML (the kubernetes-validate venv has it).
"""

import base64
import hashlib
import re
import sys
import tomllib

import yaml

DATA_DIR = "/var/lib/agent-harness"
LIVENESS_SERVICE = ""
READINESS_BY_SERVICE = [
    ("sessions", "agent_harness.v1.AgentSessionService"),
    ("translator", "agent_harness.v1.ChannelTranslatorService"),
    ("gateway", "agent_harness.v1.RuntimeGatewayService"),
]


class CheckFailed(Exception):
    pass


def expect(condition, found=None):
    if not condition:
        raise CheckFailed(found)


def seconds(duration):
    """Seconds in a duration such as "30s", "2m30s", "500ms" (the chart's subset)."""
    parts = re.findall(r"([0-9]+)(ms|s|m|h)", duration)
    expect("".join(n + u for n, u in parts) == duration, f"not a duration: {duration!r}")
    scale = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    return sum(int(n) * scale[u] for n, u in parts)


def flag(args, name):
    """The value of --name=VALUE in a container's args (None when absent)."""
    values = [a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")]
    expect(len(values) <= 1, f"--{name} given {len(values)} times: {args}")
    return values[0] if values else None


def port_of(address):
    return int(address.rsplit(":", 1)[1])


class Rendered:
    def __init__(self, path, values_path):
        with open(path) as f:
            self.docs = [d for d in yaml.safe_load_all(f) if d]
        with open(values_path) as f:
            self.values = yaml.safe_load(f) or {}

    def all(self, kind):
        return [d for d in self.docs if d["kind"] == kind]

    def one(self, kind, **labels):
        found = [
            d
            for d in self.all(kind)
            if all(d["metadata"].get("labels", {}).get(k) == v for k, v in labels.items())
        ]
        expect(len(found) == 1, f"{len(found)} {kind} objects with labels {labels}")
        return found[0]

    @property
    def sts(self):
        return self.one("StatefulSet")

    @property
    def pod(self):
        return self.sts["spec"]["template"]["spec"]

    @property
    def container(self):
        containers = self.pod["containers"]
        expect(len(containers) == 1, f"{len(containers)} containers")
        return containers[0]

    @property
    def args(self):
        return self.container["args"]

    def container_port(self, name):
        ports = [p for p in self.container.get("ports", []) if p["name"] == name]
        expect(len(ports) == 1, f"container ports named {name}: {ports}")
        return ports[0]["containerPort"]

    def config_object(self):
        configs = [d for d in self.docs if d["metadata"]["name"].endswith("-config")]
        expect(len(configs) == 1, f"{len(configs)} config objects")
        return configs[0]

    def config_text(self):
        obj = self.config_object()
        text = obj["data"]["config.toml"]
        if obj["kind"] == "Secret":
            text = base64.b64decode(text).decode()
        return text

    def config(self):
        return tomllib.loads(self.config_text())

    def mount(self, path):
        mounts = [m for m in self.container["volumeMounts"] if m["mountPath"] == path]
        expect(len(mounts) == 1, f"mounts at {path}: {mounts}")
        return mounts[0]

    def volume(self, name):
        volumes = [v for v in self.pod["volumes"] if v["name"] == name]
        expect(len(volumes) == 1, f"volumes named {name}: {volumes}")
        return volumes[0]

    def mounted_file(self, path):
        """(volume, key) a file path reads from, through the container's mounts."""
        for m in self.container["volumeMounts"]:
            prefix = m["mountPath"].rstrip("/") + "/"
            if path.startswith(prefix):
                return self.volume(m["name"]), path[len(prefix) :]
        raise CheckFailed(f"{path} is on no mounted volume")


# --- checks for every value set --------------------------------------------------------------


def database_mode(r):
    return bool(r.values.get("database", {}).get("existingSecret"))


def the_store_runs_as_one_statefulset_replica_with_no_hpa_or_pdb(r, _):
    expect(r.sts["spec"]["replicas"] == 1, r.sts["spec"]["replicas"])
    kinds = {d["kind"] for d in r.docs}
    expect(not kinds & {"Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget"}, kinds)


def the_data_dir_is_a_persistent_volume_claim(r, _):
    expect(flag(r.args, "data-dir") == DATA_DIR, r.args)
    claims = {c["metadata"]["name"]: c for c in r.sts["spec"]["volumeClaimTemplates"]}
    expect("data" in claims, list(claims))
    expect(r.mount(DATA_DIR)["name"] == "data")
    expect(not r.mount(DATA_DIR).get("readOnly"), "the data dir is read-only")


def probes_are_native_grpc_on_the_numeric_container_port(r, _):
    grpc_port = r.container_port("grpc")
    expect(isinstance(grpc_port, int), grpc_port)
    expect(port_of(flag(r.args, "listen")) == grpc_port, (flag(r.args, "listen"), grpc_port))
    for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
        probe = r.container[kind]
        handlers = set(probe) & {"grpc", "httpGet", "tcpSocket", "exec"}
        expect(handlers == {"grpc"}, f"{kind} handlers: {handlers}")
        port = probe["grpc"]["port"]
        expect(isinstance(port, int) and port == grpc_port, f"{kind} port {port!r} != {grpc_port}")


def liveness_asks_the_empty_service_and_readiness_the_first_served_harness_service(r, _):
    expect(r.container["livenessProbe"]["grpc"]["service"] == LIVENESS_SERVICE)
    expect(r.container["startupProbe"]["grpc"]["service"] == LIVENESS_SERVICE)
    served = flag(r.args, "services").split(",")
    want = next(health for name, health in READINESS_BY_SERVICE if name in served)
    got = r.container["readinessProbe"]["grpc"]["service"]
    expect(got == want, f"readiness asks {got!r}, serving {served}")


def the_service_port_is_named_grpc_with_app_protocol_grpc(r, _):
    for component in ("server", "headless"):
        service = r.one("Service", **{"app.kubernetes.io/component": component})
        grpc = [p for p in service["spec"]["ports"] if p["name"] == "grpc"]
        expect(len(grpc) == 1, service["spec"]["ports"])
        expect(grpc[0]["appProtocol"] == "grpc", grpc[0])
        expect(grpc[0]["targetPort"] == "grpc", grpc[0])
    headless = r.one("Service", **{"app.kubernetes.io/component": "headless"})
    expect(headless["spec"]["clusterIP"] == "None")
    expect(r.sts["spec"]["serviceName"] == headless["metadata"]["name"])


def sandboxed(r):
    return r.values.get("sandbox", {}).get("enabled", True)


def the_pod_runs_as_the_image_user_and_never_as_root(r, dockerfile):
    uid = int(re.search(r"^ARG APP_UID=([0-9]+)$", dockerfile, re.M).group(1))
    pod, container = r.pod["securityContext"], r.container["securityContext"]
    for context in (pod, container):
        expect(context["runAsNonRoot"] is True, context)
        expect(context["runAsUser"] == uid, f"runAsUser {context['runAsUser']} != Dockerfile {uid}")
    expect(pod["seccompProfile"] == {"type": "RuntimeDefault"}, pod)
    expect(pod["fsGroup"] == uid, pod)


def the_server_container_gets_what_the_agents_boxes_need_and_no_more(r, _):
    """With the sandbox on: a user namespace for the pod, seccomp and AppArmor unconfined and
    /proc unmasked for the server's container only, still no capability; per-runtime limits off
    (a pod has no cgroup to hand down). Off: the default profile, and every local profile says
    sandbox = "off"."""
    container = r.container["securityContext"]
    annotations = r.sts["spec"]["template"]["metadata"]["annotations"]
    apparmor = annotations.get("container.apparmor.security.beta.kubernetes.io/agent-harness")
    config = r.config()
    local = {n: p for n, p in config.get("profiles", {}).items() if p.get("kind") != "remote"}
    if sandboxed(r):
        expect(r.pod.get("hostUsers") is False, r.pod)
        expect(container["seccompProfile"] == {"type": "Unconfined"}, container)
        expect(container["procMount"] == "Unmasked", container)
        expect(apparmor == "unconfined", annotations)
        expect(config["sandbox"] == {"memory": "none", "pids": "none"}, config.get("sandbox"))
        expect(all("sandbox" not in p for p in local.values()), local)
    else:
        expect("hostUsers" not in r.pod, r.pod)
        expect(container["seccompProfile"] == {"type": "RuntimeDefault"}, container)
        expect("procMount" not in container and apparmor is None, (container, annotations))
        expect("sandbox" not in config, config)
        expect(all(p.get("sandbox") == "off" for p in local.values()), local)
    expect(container["capabilities"] == {"drop": ["ALL"]}, container["capabilities"])
    expect(container["allowPrivilegeEscalation"] is False, container)


def the_container_has_a_read_only_root_and_no_capabilities(r, _):
    context = r.container["securityContext"]
    expect(context["readOnlyRootFilesystem"] is True, context)
    expect(context["allowPrivilegeEscalation"] is False, context)
    expect(context.get("privileged", False) is False, context)
    expect(context["capabilities"].get("drop") == ["ALL"], context)
    expect(not context["capabilities"].get("add"), context)
    expect(r.pod["automountServiceAccountToken"] is False)


def only_data_tmp_home_and_workspace_are_writable(r, _):
    writable = {m["mountPath"] for m in r.container["volumeMounts"] if not m.get("readOnly")}
    home = next(e["value"] for e in r.container["env"] if e["name"] == "HOME")
    workspace = r.values.get("workspace", {}).get("mountPath", "/workspaces")
    expect(writable == {DATA_DIR, "/tmp", home, workspace}, writable)
    for path in ("/tmp", home):
        expect("emptyDir" in r.volume(r.mount(path)["name"]))


def termination_grace_exceeds_the_drain_grace(r, _):
    drain = seconds(r.config()["drain_grace"])
    grace = r.pod["terminationGracePeriodSeconds"]
    expect(isinstance(grace, int) and grace > drain, f"{grace} <= drain grace {drain}s")


def the_checksum_annotation_is_the_digest_of_the_config_the_pod_reads(r, _):
    annotation = r.sts["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    digest = hashlib.sha256(r.config_text().encode()).hexdigest()
    expect(annotation == digest, f"{annotation} != sha256 of config.toml {digest}")
    volume, key = r.mounted_file(flag(r.args, "config"))
    source = volume.get("configMap", {}).get("name") or volume.get("secret", {}).get("secretName")
    expect(source == r.config_object()["metadata"]["name"] and key == "config.toml", volume)


def every_profile_is_fenced_to_absolute_cwd_roots(r, _):
    profiles = r.config()["profiles"]
    expect(profiles, "no profiles")
    for name, profile in profiles.items():
        roots = profile.get("allowed_cwd_roots")
        expect(roots and all(root.startswith("/") for root in roots), f"{name}: {roots}")


def auth_is_tokens_or_the_explicit_insecure_flag_never_neither(r, _):
    insecure = "--insecure-allow-non-loopback" in r.args
    tokens_file = r.config().get("tokens_file")
    expect(insecure != bool(tokens_file), f"insecure flag {insecure}, tokens_file {tokens_file}")
    if tokens_file:
        volume, key = r.mounted_file(tokens_file)
        auth = r.values["auth"]
        expect(volume["secret"]["secretName"] == auth["existingSecret"], volume)
        expect(key == auth.get("key", "tokens.toml"), key)
        expect(r.mount(tokens_file.rsplit("/", 1)[0]).get("readOnly") is True)
        expect("subPath" not in r.mount(tokens_file.rsplit("/", 1)[0]), "subPath mounts never update")


def the_server_listens_on_every_pod_address(r, _):
    host = flag(r.args, "listen").rsplit(":", 1)[0]
    expect(host in ("0.0.0.0", "[::]"), host)


def orphaned_agent_processes_are_reaped_by_the_pods_pid_1(r, _):
    expect(r.pod.get("shareProcessNamespace") is True, r.pod.get("shareProcessNamespace"))


def resources_bound_the_memory(r, _):
    expect("memory" in r.container["resources"].get("limits", {}), r.container["resources"])


ALWAYS = [
    probes_are_native_grpc_on_the_numeric_container_port,
    liveness_asks_the_empty_service_and_readiness_the_first_served_harness_service,
    the_service_port_is_named_grpc_with_app_protocol_grpc,
    the_pod_runs_as_the_image_user_and_never_as_root,
    the_server_container_gets_what_the_agents_boxes_need_and_no_more,
    the_container_has_a_read_only_root_and_no_capabilities,
    only_data_tmp_home_and_workspace_are_writable,
    termination_grace_exceeds_the_drain_grace,
    the_checksum_annotation_is_the_digest_of_the_config_the_pod_reads,
    every_profile_is_fenced_to_absolute_cwd_roots,
    auth_is_tokens_or_the_explicit_insecure_flag_never_neither,
    the_server_listens_on_every_pod_address,
    orphaned_agent_processes_are_reaped_by_the_pods_pid_1,
    resources_bound_the_memory,
]

# --- checks for one value set ----------------------------------------------------------------


def defaults_render_no_metrics_monitor_or_network_policy(r, _):
    kinds = {d["kind"] for d in r.docs}
    expect(not kinds & {"ServiceMonitor", "NetworkPolicy"}, kinds)
    expect(flag(r.args, "metrics-listen") is None, r.args)
    expect(r.config_object()["kind"] == "ConfigMap")
    expect(r.pod["terminationGracePeriodSeconds"] == 30 + 15, r.pod["terminationGracePeriodSeconds"])


def tls_files_come_from_the_secret_and_probes_dial_tls(r, _):
    config = r.config()
    for key, file in (("tls_cert", "tls.crt"), ("tls_key", "tls.key")):
        volume, found = r.mounted_file(config[key])
        expect(volume["secret"]["secretName"] == r.values["tls"]["existingSecret"], volume)
        expect(found == file, found)
    for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
        expect(r.container[kind]["grpc"].get("mode") == "TLS", r.container[kind])


def the_service_monitor_scrapes_the_metrics_port_of_the_main_service_only(r, _):
    metrics_port = r.container_port("metrics")
    expect(port_of(flag(r.args, "metrics-listen")) == metrics_port, r.args)
    monitor = r.one("ServiceMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    matching = [
        s for s in r.all("Service") if selector.items() <= s["metadata"]["labels"].items()
    ]
    expect(len(matching) == 1, [s["metadata"]["name"] for s in matching])
    ports = {p["name"]: p for p in matching[0]["spec"]["ports"]}
    expect(ports["metrics"]["targetPort"] == "metrics", ports)
    expect([e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"], monitor["spec"])
    labels = r.values["metrics"]["serviceMonitor"]["labels"]
    expect(labels.items() <= monitor["metadata"]["labels"].items(), monitor["metadata"])


def the_network_policy_selects_the_pod_and_opens_only_its_ports(r, _):
    policy = r.one("NetworkPolicy")
    pod_labels = r.sts["spec"]["template"]["metadata"]["labels"]
    expect(policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items())
    opened = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    expect(opened == {r.container_port("grpc"), r.container_port("metrics")}, opened)
    expect(policy["spec"]["policyTypes"] == ["Ingress", "Egress"], policy["spec"]["policyTypes"])
    expect(policy["spec"]["egress"] == r.values["networkPolicy"]["egress"])


def custom_profiles_render_into_a_secret_config_with_their_settings(r, _):
    expect(r.config_object()["kind"] == "Secret", r.config_object()["kind"])
    expect(not r.all("ConfigMap"), "a ConfigMap holds the config too")
    config = r.config()
    claude = config["profiles"]["claude"]
    key_file = "/var/run/secrets/agent-harness/profiles/claude/ANTHROPIC_API_KEY"
    expect(
        claude
        == {
            "preset": "claude",
            "env": {"ANTHROPIC_BASE_URL": "https://gateway.example/anthropic"},
            "env_files": {"ANTHROPIC_API_KEY": key_file},
            "config_options": {"mode": "acceptEdits"},
            "permission_policy": "auto_accept",
            "allowed_cwd_roots": ["/workspaces/claude", "/workspaces/shared"],
            "startup_timeout": "1m",
            "cancel_grace": "15s",
            "idle_timeout": "30m",
            "warm_pool": 2,
            "stop_grace": "5s",
            "restart_after_cancel": True,
            "on_reopen_failure": "fresh",
            "reopen_context_bytes": 16384,
            "sandbox": "off",
        },
        claude,
    )
    old = config["profiles"]["old-claude.v0"]
    expect(old["preset"] == "claude-0.23.1" and old["command"] == "node", old)
    expect(old["restart_after_error"] is False and "restart_after_cancel" not in old, old)
    codex = config["profiles"]["codex"]
    expect(
        codex
        == {
            "preset": "codex",
            "env_passthrough": ["OPENAI_API_KEY"],
            "auth_method": "",
            "allowed_cwd_roots": ["/workspaces"],
            "sandbox": "off",
        },
        codex,
    )
    qwen = config["profiles"]["qwen"]
    expect(qwen.get("preset") == "qwen" and qwen.get("turn_timeout") == "45m", qwen)
    expect(config["profiles"]["mock"]["allowed_cwd_roots"] == ["/workspaces"], config["profiles"])
    sandboxed = config["profiles"]["sandboxed"]
    expect(
        sandboxed
        == {
            "kind": "remote",
            "bridge_profile": "mock",
            "bridge_labels": {"pool": "sandbox"},
            "reconnect_grace": "45s",
            "bridge_principals": ["sandbox-bridges"],
            "allowed_cwd_roots": ["/workspaces"],
            "startup_timeout": "20s",
        },
        sandboxed,
    )
    expect(config["limits"] == {"queued_actions": 20, "live_runtimes": 8, "prompt_bytes": 131072})
    expect(all(type(v) is int for v in config["limits"].values()), config["limits"])
    expect(config["sqlite_synchronous"] == "full" and config["log_format"] == "text", config)
    expect(config["invocation_meta_key"] == "example/invocation", config)
    expect(config["retention"] == "30d", config)
    expect(config["otlp_endpoint"] == "http://otel-collector.observability:4317", config)


def profile_secrets_are_read_only_files_from_their_secrets_named_in_env_files(r, _):
    config = r.config()
    for name, given in r.values["profiles"].items():
        files = config["profiles"][name].get("env_files", {})
        expect(set(files) == set(given.get("secretEnv", {})), (name, files))
        for var, path in files.items():
            volume, item = r.mounted_file(path)
            ref = given["secretEnv"][var]
            sources = volume["projected"]["sources"]
            found = [
                s["secret"]
                for s in sources
                if any(i["key"] == ref["key"] and i["path"] == item for i in s["secret"]["items"])
            ]
            expect(len(found) == 1 and found[0]["name"] == ref["secretName"], (path, sources))
            mount = r.mount(path.rsplit("/", 1)[0])
            expect(mount.get("readOnly") is True, mount)
    passed = {e["name"]: e for e in r.container.get("env", [])}
    expect("secretKeyRef" in passed["OPENAI_API_KEY"]["valueFrom"], passed["OPENAI_API_KEY"])


def custom_resources_grace_workspace_and_image_are_applied(r, _):
    expect(r.container["resources"] == r.values["resources"], r.container["resources"])
    expect(r.pod["terminationGracePeriodSeconds"] == 150 + 20, r.pod["terminationGracePeriodSeconds"])
    claims = {c["metadata"]["name"]: c["spec"] for c in r.sts["spec"]["volumeClaimTemplates"]}
    expect(claims["workspace"]["storageClassName"] == "fast-ssd", claims)
    expect(claims["workspace"]["resources"]["requests"]["storage"] == "20Gi", claims)
    expect(claims["data"]["storageClassName"] == "", claims)
    expect(r.container["image"].endswith("@" + r.values["image"]["digest"]), r.container["image"])
    expect(flag(r.args, "listen") == "[::]:7443", r.args)
    expect(flag(r.args, "static-files-base-url") == "https://static.example/base", r.args)
    service = r.one("Service", **{"app.kubernetes.io/component": "server"})
    expect(service["spec"]["ports"][0]["port"] == 443, service["spec"]["ports"])
    expect({"name": "RUST_LOG", "value": "info,agent_harness=debug"} in r.container["env"])


# --- the database mode ---------------------------------------------------------------


def replicas_share_nothing_but_the_database(r, _):
    spec = r.sts["spec"]
    expect("volumeClaimTemplates" not in spec, spec.get("volumeClaimTemplates"))
    expect(spec.get("podManagementPolicy") == "Parallel", spec.get("podManagementPolicy"))
    expect("emptyDir" in r.volume(r.mount(DATA_DIR)["name"]), "the data dir is not an emptyDir")
    expect(not r.all("PersistentVolumeClaim"), "a claim per release")


def the_replica_count_is_the_hpas_or_the_values(r, _):
    spec = r.sts["spec"]
    autoscaling = r.values.get("autoscaling", {})
    hpas = r.all("HorizontalPodAutoscaler")
    if autoscaling.get("enabled"):
        expect("replicas" not in spec, "replicas fights the HPA")
        expect(len(hpas) == 1, hpas)
        target = hpas[0]["spec"]["scaleTargetRef"]
        expect(target == {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": r.sts["metadata"]["name"]}, target)
        expect(hpas[0]["spec"]["minReplicas"] == autoscaling.get("minReplicas", 2), hpas[0]["spec"])
        expect(hpas[0]["spec"]["maxReplicas"] == autoscaling.get("maxReplicas", 5), hpas[0]["spec"])
    else:
        expect(spec["replicas"] == r.values.get("replicaCount", 1), spec.get("replicas"))
        expect(not hpas, hpas)


def the_disruption_budget_selects_the_pods(r, _):
    pdbs = r.all("PodDisruptionBudget")
    if not r.values.get("podDisruptionBudget", {}).get("enabled"):
        expect(not pdbs, pdbs)
        return
    expect(len(pdbs) == 1, pdbs)
    selector = pdbs[0]["spec"]["selector"]["matchLabels"]
    labels = r.sts["spec"]["template"]["metadata"]["labels"]
    expect(selector and all(labels.get(k) == v for k, v in selector.items()), (selector, labels))
    expect(pdbs[0]["spec"]["maxUnavailable"] >= 1, pdbs[0]["spec"])


def env_from_secret(r, name):
    found = [e for e in r.container["env"] if e["name"] == name]
    expect(len(found) == 1, f"env {name}: {found}")
    return found[0]["valueFrom"]["secretKeyRef"]


def the_database_url_and_replica_token_come_from_secrets_only(r, _):
    url = env_from_secret(r, "AGENT_HARNESS_DATABASE_URL")
    expect(url == {"name": r.values["database"]["existingSecret"], "key": r.values["database"].get("key", "url")}, url)
    # The replica token is a file from its Secret (like the tokens file), never an env value.
    token_file = flag(r.args, "replica-token-file")
    expect(token_file is not None, r.args)
    volume, path = r.mounted_file(token_file)
    want = r.values["replicaToken"]
    expect(volume["secret"]["secretName"] == want["existingSecret"], volume)
    items = {i["path"]: i["key"] for i in volume["secret"]["items"]}
    expect(items.get(path) == want.get("key", "token"), (items, path))
    expect(not any(e["name"].startswith("AGENT_HARNESS_REPLICA_TOKEN") for e in r.container["env"]), r.container["env"])
    expect(flag(r.args, "database-url") is None, r.args)
    expect("postgres" not in r.config_text(), "a database URL in the config")


def the_advertise_address_is_the_pod_ip_and_grpc_port(r, _):
    address = flag(r.args, "advertise-address")
    expect(address == f"$(POD_IP):{r.container_port('grpc')}", address)
    pod_ip = [e for e in r.container["env"] if e["name"] == "POD_IP"]
    expect(pod_ip == [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}], pod_ip)
    lease = r.values.get("database", {}).get("leaseTtl")
    expect(flag(r.args, "lease-ttl") == (lease or None), r.args)


def the_shared_workspace_claim_is_mounted_at_the_workspace_path(r, _):
    path = r.values.get("workspace", {}).get("mountPath", "/workspaces")
    volume = r.volume(r.mount(path)["name"])
    expect(volume.get("persistentVolumeClaim") == {"claimName": r.values["workspace"]["existingClaim"]}, volume)


SINGLE_REPLICA = [
    the_store_runs_as_one_statefulset_replica_with_no_hpa_or_pdb,
    the_data_dir_is_a_persistent_volume_claim,
]
DATABASE = [
    replicas_share_nothing_but_the_database,
    the_replica_count_is_the_hpas_or_the_values,
    the_disruption_budget_selects_the_pods,
    the_database_url_and_replica_token_come_from_secrets_only,
    the_advertise_address_is_the_pod_ip_and_grpc_port,
]


def a_translator_only_process_is_ready_on_the_translator(r, _):
    expect(flag(r.args, "services") == "translator", r.args)
    service = r.container["readinessProbe"]["grpc"]["service"]
    expect(service == "agent_harness.v1.ChannelTranslatorService", service)


def the_bridge_is_rendered_only_when_enabled(r, _):
    expect(not r.all("Deployment"), [d["metadata"]["name"] for d in r.all("Deployment")])


def bridge_parts(r):
    (deployment,) = r.all("Deployment")
    (config,) = [d for d in r.all("ConfigMap") if d["metadata"]["name"].endswith("-bridge")]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return deployment, config, container


def the_bridge_dials_the_service_with_its_runtime_token(r, _):
    deployment, _, container = bridge_parts(r)
    args = container["args"]
    expect(args[0] == "bridge", args)
    (service,) = [s for s in r.all("Service") if "clusterIP" not in s["spec"]]
    port = service["spec"]["ports"][0]["port"]
    want = f"http://{service['metadata']['name']}.agents.svc:{port}"
    expect(flag(args, "connect") == want, (args, want))
    token = flag(args, "token-file")
    secret = r.values["bridge"]["tokenSecret"]["existingSecret"]
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    mounts = [m for m in container["volumeMounts"] if token.startswith(m["mountPath"].rstrip("/") + "/")]
    expect(len(mounts) == 1, (token, container["volumeMounts"]))
    (volume,) = [v for v in volumes if v["name"] == mounts[0]["name"]]
    expect(volume.get("secret", {}).get("secretName") == secret, volume)
    expect(deployment["spec"]["replicas"] == r.values["bridge"]["replicaCount"], deployment["spec"])


def the_harness_service_never_selects_the_bridge_pods(r, _):
    deployment, _, _ = bridge_parts(r)
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    for service in r.all("Service"):
        selector = service["spec"]["selector"]
        expect(not all(pod_labels.get(k) == v for k, v in selector.items()), (selector, pod_labels))
    sts_labels = r.sts["spec"]["template"]["metadata"]["labels"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    expect(not all(sts_labels.get(k) == v for k, v in selector.items()), (selector, sts_labels))


def the_bridge_config_holds_its_labels_profiles_and_grace(r, _):
    deployment, config, container = bridge_parts(r)
    text = config["data"]["bridge.toml"]
    bridge = tomllib.loads(text)
    values = r.values["bridge"]
    expect(bridge["labels"] == values["labels"], bridge)
    expect(bridge["reconnect_grace"] == values["reconnectGrace"], bridge)
    expect(set(bridge["profiles"]) == set(values["profiles"]), bridge)
    workspace = r.values.get("workspace", {}).get("mountPath", "/workspaces")
    for name, profile in bridge["profiles"].items():
        given = values["profiles"][name]
        expect(profile.get("preset") == given.get("preset"), profile)
        expect(profile.get("command") == given.get("command"), profile)
        expect(profile.get("args", []) == given.get("args", []), profile)
        expect(profile.get("env", {}) == given.get("env", {}), profile)
        expect(profile["allowed_cwd_roots"] == given.get("allowedCwdRoots", [workspace]), profile)
        expect(profile.get("stop_grace") == given.get("stopGrace"), profile)
        expect(profile.get("env_passthrough", []) == given.get("envPassthrough", []), profile)
        files = profile.get("env_files", {})
        expect(set(files) == set(given.get("secretEnv", {})), profile)
        volumes = deployment["spec"]["template"]["spec"]["volumes"]
        for var, path in files.items():
            directory, item = path.rsplit("/", 1)
            (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == directory]
            expect(mount.get("readOnly") is True, mount)
            (volume,) = [v for v in volumes if v["name"] == mount["name"]]
            ref = given["secretEnv"][var]
            expect(
                {"name": ref["secretName"], "items": [{"key": ref["key"], "path": item}]}
                in [s["secret"] for s in volume["projected"]["sources"]],
                volume,
            )
    expect(not set(bridge) - {"labels", "reconnect_grace", "profiles", "sandbox"}, bridge)
    if sandboxed(r):
        expect(bridge["sandbox"] == {"memory": "none", "pids": "none"}, bridge)
        expect(all("sandbox" not in p for p in bridge["profiles"].values()), bridge)
        pod = deployment["spec"]["template"]["spec"]
        expect(pod.get("hostUsers") is False, pod)
        expect(container["securityContext"]["procMount"] == "Unmasked", container)
    else:
        expect(all(p.get("sandbox") == "off" for p in bridge["profiles"].values()), bridge)
    annotation = deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    expect(annotation == hashlib.sha256(text.rstrip("\n").encode()).hexdigest() or
           annotation == hashlib.sha256(text.encode()).hexdigest(), annotation)
    config_path = flag(container["args"], "config")
    expect(any(config_path.startswith(m["mountPath"] + "/") for m in container["volumeMounts"]), config_path)


PER_SET = {
    "insecure": [
        defaults_render_no_metrics_monitor_or_network_policy,
        the_bridge_is_rendered_only_when_enabled,
    ],
    "bridge": [
        the_bridge_dials_the_service_with_its_runtime_token,
        the_harness_service_never_selects_the_bridge_pods,
        the_bridge_config_holds_its_labels_profiles_and_grace,
    ],
    "tokens-tls-monitoring": [
        tls_files_come_from_the_secret_and_probes_dial_tls,
        the_service_monitor_scrapes_the_metrics_port_of_the_main_service_only,
        the_network_policy_selects_the_pod_and_opens_only_its_ports,
    ],
    "custom": [
        custom_profiles_render_into_a_secret_config_with_their_settings,
        profile_secrets_are_read_only_files_from_their_secrets_named_in_env_files,
        custom_resources_grace_workspace_and_image_are_applied,
    ],
    "translator-only": [a_translator_only_process_is_ready_on_the_translator],
    "database": [the_shared_workspace_claim_is_mounted_at_the_workspace_path],
}


def main():
    name, rendered, values, dockerfile_path = sys.argv[1:5]
    r = Rendered(rendered, values)
    with open(dockerfile_path) as f:
        dockerfile = f.read()
    checks = ALWAYS + (DATABASE if database_mode(r) else SINGLE_REPLICA) + PER_SET.get(name, [])
    for check in checks:
        try:
            check(r, dockerfile)
        except (CheckFailed, KeyError, TypeError, AttributeError, StopIteration) as e:
            detail = f"{type(e).__name__}: {e}" if not isinstance(e, CheckFailed) else e
            print(f"    {name}: FAILED {check.__name__.replace('_', ' ')}: {detail}", file=sys.stderr)
            sys.exit(1)
    print(f"    {name}: {len(checks)} checks passed ({len(ALWAYS)} common, {len(checks) - len(ALWAYS)} for this set)")


if __name__ == "__main__":
    main()
