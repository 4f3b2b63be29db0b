{{/* Names */}}

{{- define "agent-harness.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "agent-harness.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "agent-harness.headlessName" -}}
{{- printf "%s-headless" (include "agent-harness.fullname" . | trunc 54 | trimSuffix "-") -}}
{{- end -}}

{{- define "agent-harness.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "agent-harness.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Labels */}}

{{- define "agent-harness.selectorLabels" -}}
app.kubernetes.io/name: {{ include "agent-harness.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "agent-harness.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "agent-harness.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "agent-harness.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* Paths inside the container */}}

{{/* Several replicas on PostgreSQL rather than one on the embedded store. */}}
{{- define "agent-harness.databaseMode" -}}{{- if .Values.database.existingSecret -}}true{{- end -}}{{- end -}}
{{- define "agent-harness.dataDir" -}}/var/lib/agent-harness{{- end -}}
{{- define "agent-harness.configDir" -}}/etc/agent-harness/config{{- end -}}
{{- define "agent-harness.tokensDir" -}}/etc/agent-harness/tokens{{- end -}}
{{- define "agent-harness.tlsDir" -}}/etc/agent-harness/tls{{- end -}}
{{- define "agent-harness.homeDir" -}}/home/agent-harness{{- end -}}

{{/*
Seconds in a duration such as "30s", "2m", "1m30s" or "500ms" (the subset of the server's
duration syntax that values.schema.json admits), rounded up.
*/}}
{{- define "agent-harness.durationSeconds" -}}
{{- if not (regexMatch "^([0-9]+(ms|s|m|h))+$" .) -}}
{{- fail (printf "%q is not a duration such as \"30s\", \"2m\" or \"1m30s\"" .) -}}
{{- end -}}
{{- $millis := 0 -}}
{{- range regexFindAll "[0-9]+(ms|s|m|h)" . -1 -}}
{{- $n := regexFind "^[0-9]+" . | atoi -}}
{{- $unit := trimPrefix (regexFind "^[0-9]+" .) . -}}
{{- if eq $unit "ms" }}{{ $millis = add $millis $n }}
{{- else if eq $unit "s" }}{{ $millis = add $millis (mul $n 1000) }}
{{- else if eq $unit "m" }}{{ $millis = add $millis (mul $n 60000) }}
{{- else }}{{ $millis = add $millis (mul $n 3600000) }}
{{- end -}}
{{- end -}}
{{- div (add $millis 999) 1000 -}}
{{- end -}}

{{/* terminationGracePeriodSeconds: above the drain grace, so the drain can finish. */}}
{{- define "agent-harness.terminationGracePeriodSeconds" -}}
{{- $drain := include "agent-harness.durationSeconds" .Values.server.drainGrace | atoi -}}
{{- $explicit := .Values.server.terminationGracePeriodSeconds -}}
{{- if kindIs "invalid" $explicit -}}
{{- add $drain .Values.server.terminationGraceMarginSeconds -}}
{{- else if le (int $explicit) $drain -}}
{{- fail (printf "server.terminationGracePeriodSeconds (%d) must be greater than server.drainGrace (%s = %ds): the kubelet would kill the server before its drain ends" (int $explicit) .Values.server.drainGrace $drain) -}}
{{- else -}}
{{- int $explicit -}}
{{- end -}}
{{- end -}}

{{/* The health service readiness watches: the first served of ours (each goes NOT_SERVING on drain). */}}
{{- define "agent-harness.readinessService" -}}
{{- $services := .Values.server.services -}}
{{- if has "sessions" $services -}}agent_harness.v1.AgentSessionService
{{- else if has "translator" $services -}}agent_harness.v1.ChannelTranslatorService
{{- else -}}agent_harness.v1.RuntimeGatewayService
{{- end -}}
{{- end -}}

{{/* Refusals that a JSON schema cannot express, or that need a clear sentence. */}}
{{- define "agent-harness.validate" -}}
{{- if .Values.sandbox.enabled -}}
{{- range $name, $p := .Values.profiles -}}
{{- if $p.warmPool -}}
{{- fail (printf "profiles.%s.warmPool: a warm runtime starts before its session's owner and cwd are known, so it cannot run in a box; set sandbox.enabled: false to keep warm pools" $name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if .Values.database.url -}}
{{- fail "database.url: a database URL holds a password, so the chart takes it only from a Secret: put it there and name the Secret in database.existingSecret (its key in database.key)" -}}
{{- end -}}
{{- if and .Values.workspace.persistence.enabled .Values.workspace.existingClaim -}}
{{- fail "workspace.existingClaim and workspace.persistence.enabled both give the workspace a volume: choose one" -}}
{{- end -}}
{{- if and .Values.database.existingSecret .Values.workspace.persistence.enabled -}}
{{- fail "workspace.persistence.enabled gives each pod a workspace of its own, but with a database a session's runtime may start on any pod: mount shared storage with workspace.existingClaim (ReadWriteMany) instead" -}}
{{- end -}}
{{- if and .Values.database.existingSecret .Values.auth.existingSecret (not .Values.replicaToken.existingSecret) -}}
{{- fail "replicaToken.existingSecret: with a database and tokens, replicas forward calls to each other with a token of kind replica; name the Secret holding it" -}}
{{- end -}}
{{- if and .Values.autoscaling.enabled (gt (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas)) -}}
{{- fail "autoscaling.minReplicas is above autoscaling.maxReplicas" -}}
{{- end -}}
{{- if and .Values.tls.enabled (not .Values.tls.existingSecret) -}}
{{- fail "tls.enabled needs tls.existingSecret: a Secret of type kubernetes.io/tls with tls.crt and tls.key" -}}
{{- end -}}
{{- if and .Values.tls.enabled (semverCompare "<1.37.0-0" .Capabilities.KubeVersion.Version) -}}
{{- fail (printf "tls.enabled needs Kubernetes 1.37 or later (this render is for %s): before 1.37 the kubelet's gRPC probes dial plaintext and would never reach a TLS-only server. From 1.37 the chart sets the probes' mode: TLS (feature gate GRPCContainerProbeTLS)." .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- if and .Values.metrics.serviceMonitor.enabled (not .Values.metrics.enabled) -}}
{{- fail "metrics.serviceMonitor.enabled needs metrics.enabled: there is no metrics port to scrape" -}}
{{- end -}}
{{- $_ := include "agent-harness.terminationGracePeriodSeconds" . -}}
{{- end -}}

{{/*
The config file: keys the flags do not carry. listen, data_dir, metrics_listen,
services, static_files_base_url and the insecure flag are passed as flags (see the StatefulSet).
*/}}
{{- define "agent-harness.configToml" -}}
{{- $s := .Values.server -}}
{{- $config := dict "drain_grace" $s.drainGrace "log_format" $s.logFormat "sqlite_synchronous" $s.sqliteSynchronous -}}
{{- with $s.invocationMetaKey }}{{ $_ := set $config "invocation_meta_key" . }}{{ end -}}
{{- with $s.retention }}{{ $_ := set $config "retention" . }}{{ end -}}
{{- with $s.otlpEndpoint }}{{ $_ := set $config "otlp_endpoint" . }}{{ end -}}
{{- if .Values.auth.existingSecret -}}
{{- $_ := set $config "tokens_file" (printf "%s/%s" (include "agent-harness.tokensDir" .) .Values.auth.key) -}}
{{- end -}}
{{- if .Values.tls.enabled -}}
{{- $_ := set $config "tls_cert" (printf "%s/tls.crt" (include "agent-harness.tlsDir" .)) -}}
{{- $_ := set $config "tls_key" (printf "%s/tls.key" (include "agent-harness.tlsDir" .)) -}}
{{- end -}}
{{- if $s.limits -}}
{{- $limits := dict -}}
{{- range $key, $value := $s.limits }}{{ $_ := set $limits $key (int64 $value) }}{{ end -}}
{{- $_ := set $config "limits" $limits -}}
{{- end -}}
{{- $profiles := dict -}}
{{- range $name, $p := .Values.profiles -}}
{{- $profile := dict -}}
{{- if eq (default "local" $p.kind) "remote" }}
{{- $_ := set $profile "kind" "remote" -}}
{{- $_ := set $profile "bridge_profile" $p.bridgeProfile -}}
{{- with $p.bridgeLabels }}{{ $_ := set $profile "bridge_labels" . }}{{ end -}}
{{- with $p.reconnectGrace }}{{ $_ := set $profile "reconnect_grace" . }}{{ end -}}
{{- with $p.bridgePrincipals }}{{ $_ := set $profile "bridge_principals" . }}{{ end -}}
{{- else }}
{{- with $p.command }}{{ $_ := set $profile "command" . }}{{ end -}}
{{- end }}
{{- with $p.preset }}{{ $_ := set $profile "preset" . }}{{ end -}}
{{- with $p.args }}{{ $_ := set $profile "args" . }}{{ end -}}
{{- with $p.env }}{{ $_ := set $profile "env" . }}{{ end -}}
{{- with $p.envPassthrough }}{{ $_ := set $profile "env_passthrough" . }}{{ end -}}
{{- with $p.secretEnv }}{{ $_ := set $profile "env_files" (include "agent-harness.secretEnvFiles" (list $ $name .) | fromJson) }}{{ end -}}
{{- with $p.configOptions }}{{ $_ := set $profile "config_options" . }}{{ end -}}
{{- if hasKey $p "authMethod" }}{{ $_ := set $profile "auth_method" $p.authMethod }}{{ end -}}
{{- with $p.permissionPolicy }}{{ $_ := set $profile "permission_policy" . }}{{ end -}}
{{- $_ := set $profile "allowed_cwd_roots" (default (list $.Values.workspace.mountPath) $p.allowedCwdRoots) -}}
{{- with $p.startupTimeout }}{{ $_ := set $profile "startup_timeout" . }}{{ end -}}
{{- with $p.turnTimeout }}{{ $_ := set $profile "turn_timeout" . }}{{ end -}}
{{- with $p.cancelGrace }}{{ $_ := set $profile "cancel_grace" . }}{{ end -}}
{{- with $p.idleTimeout }}{{ $_ := set $profile "idle_timeout" . }}{{ end -}}
{{- with $p.stopGrace }}{{ $_ := set $profile "stop_grace" . }}{{ end -}}
{{- if hasKey $p "restartAfterCancel" }}{{ $_ := set $profile "restart_after_cancel" $p.restartAfterCancel }}{{ end -}}
{{- if hasKey $p "restartAfterError" }}{{ $_ := set $profile "restart_after_error" $p.restartAfterError }}{{ end -}}
{{- with $p.onReopenFailure }}{{ $_ := set $profile "on_reopen_failure" . }}{{ end -}}
{{- if hasKey $p "reopenContextBytes" }}{{ $_ := set $profile "reopen_context_bytes" (int64 $p.reopenContextBytes) }}{{ end -}}
{{- with $p.warmPool }}{{ $_ := set $profile "warm_pool" (int64 .) }}{{ end -}}
{{- if ne (default "local" $p.kind) "remote" }}
{{- if $.Values.sandbox.enabled }}
{{- with $p.egressAllow }}{{ $_ := set $profile "egress" (dict "allow" .) }}{{ end -}}
{{- else }}
{{- $_ := set $profile "sandbox" "off" -}}
{{- end }}
{{- end }}
{{- $_ := set $profiles $name $profile -}}
{{- end -}}
{{- if $profiles }}{{ $_ := set $config "profiles" $profiles }}{{ end -}}
{{- if .Values.sandbox.enabled }}
{{- /* Pods have no cgroup of their own to hand to runtimes: the pod's limits bound them. */ -}}
{{- $_ := set $config "sandbox" (dict "memory" "none" "pids" "none") -}}
{{- end -}}
# agent-harness config, rendered by the Helm chart {{ .Chart.Name }}-{{ .Chart.Version }}.
{{ toToml $config | trim }}
{{ end -}}

{{/* "host:port", with IPv6 hosts in brackets. Takes (list host port). */}}
{{- define "agent-harness.listenAddress" -}}
{{- $host := index . 0 -}}
{{- if contains ":" $host -}}
{{- printf "[%s]:%d" $host (index . 1) -}}
{{- else -}}
{{- printf "%s:%d" $host (index . 1) -}}
{{- end -}}
{{- end -}}

{{/* A volumeClaimTemplate. Takes (list name persistenceValues root). */}}
{{- define "agent-harness.volumeClaim" -}}
{{- $name := index . 0 -}}
{{- $p := index . 1 -}}
{{- $root := index . 2 -}}
metadata:
  name: {{ $name }}
  labels:
    {{- include "agent-harness.selectorLabels" $root | nindent 4 }}
spec:
  accessModes:
    {{- toYaml $p.accessModes | nindent 4 }}
  {{- if not (kindIs "invalid" $p.storageClassName) }}
  storageClassName: {{ $p.storageClassName | quote }}
  {{- end }}
  resources:
    requests:
      storage: {{ $p.size }}
{{- end -}}

{{/* The bridge's pods: a name label of their own, so the harness's Service skips them. */}}
{{- define "agent-harness.bridgeSelectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-bridge" (include "agent-harness.name" . | trunc 56 | trimSuffix "-") }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* bridge.toml: labels, reconnect grace and the bridge's own profiles (defaulting their
allowed cwd roots to the workspace). No bridge_id: each pod is named by its host name. */}}
{{- define "agent-harness.bridgeToml" -}}
{{- with .Values.bridge.reconnectGrace }}
reconnect_grace = {{ . | toJson }}
{{- end }}
[labels]
{{- range $key, $value := .Values.bridge.labels }}
{{ $key | toJson }} = {{ $value | toJson }}
{{- end }}
{{- if .Values.sandbox.enabled }}

# Pods have no cgroup of their own to hand to runtimes: the pod's limits bound them.
[sandbox]
memory = "none"
pids = "none"
{{- end }}
{{- range $name, $profile := .Values.bridge.profiles }}

[profiles.{{ $name | toJson }}]
{{- with $profile.preset }}
preset = {{ . | toJson }}
{{- end }}
{{- with $profile.command }}
command = {{ . | toJson }}
{{- end }}
{{- if or $profile.command $profile.args }}
args = {{ default list $profile.args | toJson }}
{{- end }}
allowed_cwd_roots = {{ default (list $.Values.workspace.mountPath) $profile.allowedCwdRoots | toJson }}
{{- with $profile.stopGrace }}
stop_grace = {{ . | toJson }}
{{- end }}
{{- if not $.Values.sandbox.enabled }}
sandbox = "off"
{{- end }}
{{- with $profile.envPassthrough }}
env_passthrough = {{ . | toJson }}
{{- end }}
{{- with $profile.secretEnv }}
[profiles.{{ $name | toJson }}.env_files]
{{- range $var, $path := include "agent-harness.secretEnvFiles" (list $ $name .) | fromJson }}
{{ $var | toJson }} = {{ $path | toJson }}
{{- end }}
{{- end }}
{{- with $profile.env }}
[profiles.{{ $name | toJson }}.env]
{{- range $key, $value := . }}
{{ $key | toJson }} = {{ $value | toJson }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Where a profile's secretEnv files are mounted: one directory per profile. */}}
{{- define "agent-harness.profileSecretsDir" -}}
/var/run/secrets/agent-harness/profiles
{{- end -}}

{{/* The volume holding a profile's secretEnv (a DNS label whatever the profile's name).
Takes (list kind profileName), kind "profile" or "bridge-profile". */}}
{{- define "agent-harness.secretEnvVolume" -}}
{{- printf "%s-secrets-%s" (index . 0) (sha256sum (index . 1) | trunc 10) -}}
{{- end -}}

{{/* A profile's env_files as JSON: each secretEnv variable read from its mounted file. Takes
(list root profileName secretEnv). */}}
{{- define "agent-harness.secretEnvFiles" -}}
{{- $root := index . 0 -}}
{{- $name := index . 1 -}}
{{- $files := dict -}}
{{- range $var, $ref := index . 2 -}}
{{- $_ := set $files $var (printf "%s/%s/%s" (include "agent-harness.profileSecretsDir" $root) $name $var) -}}
{{- end -}}
{{- $files | toJson -}}
{{- end -}}

{{/* The volume mounts of profiles' secretEnv. Takes (list root kind profiles). */}}
{{- define "agent-harness.secretEnvMounts" -}}
{{- $root := index . 0 -}}
{{- $kind := index . 1 -}}
{{- range $name, $p := index . 2 }}
{{- if $p.secretEnv }}
- name: {{ include "agent-harness.secretEnvVolume" (list $kind $name) }}
  mountPath: {{ include "agent-harness.profileSecretsDir" $root }}/{{ $name }}
  readOnly: true
{{- end }}
{{- end }}
{{- end -}}

{{/* The volumes of profiles' secretEnv: a projected volume per profile, one file per variable
(a directory mount, so a rotated Secret reaches the next runtime). Takes (list kind profiles). */}}
{{- define "agent-harness.secretEnvVolumes" -}}
{{- $kind := index . 0 -}}
{{- range $name, $p := index . 1 }}
{{- if $p.secretEnv }}
- name: {{ include "agent-harness.secretEnvVolume" (list $kind $name) }}
  projected:
    sources:
    {{- range $var, $ref := $p.secretEnv }}
      - secret:
          name: {{ $ref.secretName }}
          items:
            - key: {{ $ref.key }}
              path: {{ $var }}
    {{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The server's (and a bridge's) container securityContext: the chart's, and with the sandbox
on, seccomp unconfined and /proc unmasked for the boxes it builds (values.yaml, sandbox). */}}
{{- define "agent-harness.containerSecurityContext" -}}
{{- $context := deepCopy .Values.containerSecurityContext -}}
{{- if .Values.sandbox.enabled -}}
{{- $_ := set $context "seccompProfile" (dict "type" "Unconfined") -}}
{{- $_ := set $context "procMount" "Unmasked" -}}
{{- end -}}
{{- toYaml $context -}}
{{- end -}}
