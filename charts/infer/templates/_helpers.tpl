{{/* Names: <release>-<chart> unless overridden, cut to the 63 characters of a DNS label. */}}
{{- define "infer.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "infer.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* A resource name: the full name and a suffix, the full name cut to leave room for it. */}}
{{- define "infer.componentName" -}}
{{- $root := index . 0 }}{{- $suffix := index . 1 }}
{{- printf "%s-%s" (include "infer.fullname" $root | trunc (int (sub 62 (len $suffix))) | trimSuffix "-") $suffix }}
{{- end }}

{{- define "infer.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every resource; `infer.selectorLabels` takes (list $ "server") or (list $ "gateway"). */}}
{{- define "infer.labels" -}}
helm.sh/chart: {{ include "infer.chart" . }}
app.kubernetes.io/name: {{ include "infer.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: infer
{{- end }}

{{- define "infer.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "infer.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "infer.isSeparateGateway" -}}
{{- if eq .Values.gateway.mode "separate" }}true{{ end }}
{{- end }}

{{- define "infer.image" -}}
{{- $tag := .Values.image.tag | default (printf "%s%s" .Chart.AppVersion (ternary "-cuda" "" (gt (int .Values.gpu.count) 0))) }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}

{{/* The CPU image, for pods that need no GPU (the separate gateway, the helm test): never the -cuda tag. */}}
{{- define "infer.cpuImage" -}}
{{- $tag := .Values.image.cpuTag | default (trimSuffix "-cuda" (.Values.image.tag | default .Chart.AppVersion)) }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}

{{- define "infer.tlsOn" -}}
{{- if .Values.tls.secretName }}true{{ end }}
{{- end }}

{{/* Every port a pod listens on is its own: two on one number would fail at start (or share a listener). */}}
{{- define "infer.checkPorts" -}}
{{- $seen := dict }}
{{- $names := list "grpc" "http" "metrics" }}
{{- if include "infer.tlsOn" . }}{{ $names = append $names "health" }}{{ end }}
{{- if .Values.kvEvents.enabled }}{{ $names = concat $names (list "kvEvents" "kvEventsReplay") }}{{ end }}
{{- range $name := $names }}
{{- $port := toString (index $.Values.ports $name) }}
{{- if hasKey $seen $port }}
{{- fail (printf "ports.%s and ports.%s are both %s: each port needs its own number" (get $seen $port) $name $port) }}
{{- end }}
{{- $_ := set $seen $port $name }}
{{- end }}
{{- end }}

{{/* RollingUpdate (nulls filled in: CPU pods surge, GPU pods replace one at a time) or Recreate, never both. */}}
{{- define "infer.updateStrategy" -}}
{{- $u := .Values.updateStrategy }}
type: {{ $u.type }}
{{- if eq $u.type "RollingUpdate" }}
{{- $gpu := gt (int .Values.gpu.count) 0 }}
{{- $r := $u.rollingUpdate | default dict }}
{{- $surge := ternary (ternary 0 1 $gpu) $r.maxSurge (kindIs "invalid" $r.maxSurge) }}
{{- $unavailable := ternary (ternary 1 0 $gpu) $r.maxUnavailable (kindIs "invalid" $r.maxUnavailable) }}
{{- if and (regexMatch "^0%?$" (toString $surge)) (regexMatch "^0%?$" (toString $unavailable)) }}
{{- fail "updateStrategy.rollingUpdate: maxSurge and maxUnavailable are both 0: a rollout could never start" }}
{{- end }}
rollingUpdate:
  maxSurge: {{ $surge | toJson }}
  maxUnavailable: {{ $unavailable | toJson }}
{{- end }}
{{- end }}

{{- define "infer.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "infer.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The pod's grace period: it must outlast the preStop sleep and the server's drain. */}}
{{- define "infer.terminationGracePeriodSeconds" -}}
{{- $needed := add (int .Values.preStopSleepS) (int (ceil .Values.shutdownGraceS)) }}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds }}
{{- add $needed 15 }}
{{- else if le (int .Values.terminationGracePeriodSeconds) $needed }}
{{- fail (printf "terminationGracePeriodSeconds (%v) must exceed preStopSleepS + shutdownGraceS (%d): a drain would be cut short" .Values.terminationGracePeriodSeconds $needed) }}
{{- else }}
{{- int .Values.terminationGracePeriodSeconds }}
{{- end }}
{{- end }}

{{/* An env value as the server parses it: whole numbers without an exponent, booleans as true/false. */}}
{{- define "infer.envValue" -}}
{{- if and (kindIs "float64" .) (eq . (floor .)) }}
{{- int64 . | toString | quote }}
{{- else }}
{{- toString . | quote }}
{{- end }}
{{- end }}

{{/* INFER_MODEL for the model source; empty for the default model baked into the image. */}}
{{- define "infer.modelDir" -}}
{{- $m := .Values.model }}
{{- if eq $m.source "pvc" }}
{{- printf "/mnt/model-store/%s" (required "model.pvc.path: the model directory inside the claim" $m.pvc.path | trimPrefix "/") | clean }}
{{- else if eq $m.source "copy" }}
{{- printf "/models/%s" (base (required "model.copy.from: the model directory to copy" $m.copy.from)) }}
{{- else }}
{{- $m.path }}
{{- end }}
{{- end }}

{{/* The model name clients send (what /v1/models lists). */}}
{{- define "infer.modelId" -}}
{{- if .Values.gateway.modelId }}
{{- .Values.gateway.modelId }}
{{- else }}
{{- with include "infer.modelDir" . }}{{ base . }}{{ else }}SmolLM2-135M-Instruct{{ end }}
{{- end }}
{{- end }}

{{- define "infer.serverEnv" -}}
- name: INFER_HOST
  value: "0.0.0.0"
- name: INFER_GRPC_PORT
  value: {{ include "infer.envValue" .Values.ports.grpc }}
- name: INFER_HTTP_PORT
  value: {{ if include "infer.isSeparateGateway" . }}"off"{{ else }}{{ include "infer.envValue" .Values.ports.http }}{{ end }}
- name: INFER_METRICS_PORT
  value: {{ if .Values.metrics.enabled }}{{ include "infer.envValue" .Values.ports.metrics }}{{ else }}"off"{{ end }}
{{- if include "infer.httpMetrics" . }}
- name: INFER_HTTP_METRICS
  value: "true"
{{- end }}
{{- include "infer.kvEventsEnv" . }}
- name: INFER_SHUTDOWN_GRACE_S
  value: {{ include "infer.envValue" .Values.shutdownGraceS }}
{{- if not (kindIs "invalid" .Values.maxConnectionAgeS) }}
- name: INFER_MAX_CONNECTION_AGE_S
  value: {{ include "infer.envValue" .Values.maxConnectionAgeS }}
{{- end }}
{{- if not (kindIs "invalid" .Values.maxConnectionAgeGraceS) }}
- name: INFER_MAX_CONNECTION_AGE_GRACE_S
  value: {{ include "infer.envValue" .Values.maxConnectionAgeGraceS }}
{{- end }}
{{- include "infer.threadsEnv" . }}
{{- include "infer.tlsEnv" . }}
{{- with include "infer.modelDir" . }}
- name: INFER_MODEL
  value: {{ . | quote }}
{{- end }}
{{- if and (kindIs "invalid" .Values.config.device) (gt (int .Values.gpu.count) 0) }}
- name: INFER_DEVICE
  value: "cuda"
{{- end }}
{{- range $key, $value := .Values.config }}
{{- if not (kindIs "invalid" $value) }}
- name: {{ printf "INFER_%s" (upper $key) }}
  value: {{ include "infer.envValue" $value }}
{{- end }}
{{- end }}
{{- with .Values.logLevel }}
- name: INFER_LOG_LEVEL
  value: {{ . | quote }}
{{- end }}
{{- with .Values.kernels }}
- name: INFER_KERNELS
  value: {{ . | quote }}
{{- end }}
{{- if .Values.apiKeys.secretName }}
- name: INFER_API_KEYS_FILE
  value: {{ include "infer.apiKeysFile" . | quote }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The API keys Secret, mounted read-only: where the keys file lies, and its volume and mount. */}}
{{- define "infer.apiKeysFile" -}}/etc/infer/api-keys/keys{{- end }}

{{- define "infer.apiKeysVolume" -}}
{{- with .Values.apiKeys.secretName }}
- name: api-keys
  secret:
    secretName: {{ . }}
    items:
      - key: {{ $.Values.apiKeys.secretKey }}
        path: keys
{{- end }}
{{- end }}

{{- define "infer.apiKeysMount" -}}
{{- if .Values.apiKeys.secretName }}
- name: api-keys
  mountPath: /etc/infer/api-keys
  readOnly: true
{{- end }}
{{- end }}

{{/* OMP_NUM_THREADS, which torch reads: set, or the CPU request rounded up; not when extraEnv sets it. */}}
{{- define "infer.threadsEnv" -}}
{{- $inExtra := false }}
{{- range .Values.extraEnv }}{{ if eq .name "OMP_NUM_THREADS" }}{{ $inExtra = true }}{{ end }}{{ end }}
{{- $requests := (.Values.resources | default dict).requests | default dict }}
{{- if $inExtra }}
{{- else if not (kindIs "invalid" .Values.cpuThreads) }}
- name: OMP_NUM_THREADS
  value: {{ include "infer.envValue" .Values.cpuThreads }}
{{- else if hasKey $requests "cpu" }}
- name: OMP_NUM_THREADS
  valueFrom:
    resourceFieldRef:
      containerName: server
      resource: requests.cpu
      divisor: "1"
{{- end }}
{{- end }}

{{/* TLS: the server's certificate from tls.secretName, the client CA for mTLS; probes use the health port. */}}
{{- define "infer.tlsDir" -}}/etc/infer/tls{{- end }}

{{- define "infer.tlsEnv" -}}
{{- if include "infer.tlsOn" . }}
- name: INFER_TLS_CERT
  value: {{ printf "%s/server/tls.crt" (include "infer.tlsDir" .) | quote }}
- name: INFER_TLS_KEY
  value: {{ printf "%s/server/tls.key" (include "infer.tlsDir" .) | quote }}
- name: INFER_HEALTH_PORT
  value: {{ include "infer.envValue" .Values.ports.health }}
{{- with .Values.tls.clientCaSecretName }}
- name: INFER_TLS_CLIENT_CA
  value: {{ printf "%s/client-ca/ca.crt" (include "infer.tlsDir" $) | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* Volumes of the TLS files: `server` (the server pods), `ca` and `client` (the chart's own clients). */}}
{{- define "infer.tlsVolumes" -}}
{{- $root := index . 0 }}{{- $role := index . 1 }}{{- $t := $root.Values.tls }}
{{- if $t.secretName }}
{{- if eq $role "server" }}
- name: tls-server
  secret:
    secretName: {{ $t.secretName }}
    items: [{key: tls.crt, path: tls.crt}, {key: tls.key, path: tls.key}]
{{- with $t.clientCaSecretName }}
- name: tls-client-ca
  secret:
    secretName: {{ . }}
    items: [{key: ca.crt, path: ca.crt}]
{{- end }}
{{- else }}
- name: tls-ca
  secret:
    secretName: {{ $t.secretName }}
    items: [{key: ca.crt, path: ca.crt}]
{{- if $t.clientCaSecretName }}
- name: tls-client
  secret:
    secretName: {{ required "tls.clientSecretName: the client certificate the gateway and the helm test present under mTLS" $t.clientSecretName }}
    items: [{key: tls.crt, path: tls.crt}, {key: tls.key, path: tls.key}]
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{- define "infer.tlsMounts" -}}
{{- $root := index . 0 }}{{- $role := index . 1 }}{{- $t := $root.Values.tls }}{{- $dir := include "infer.tlsDir" $root }}
{{- if $t.secretName }}
{{- if eq $role "server" }}
- {name: tls-server, mountPath: {{ $dir }}/server, readOnly: true}
{{- if $t.clientCaSecretName }}
- {name: tls-client-ca, mountPath: {{ $dir }}/client-ca, readOnly: true}
{{- end }}
{{- else }}
- {name: tls-ca, mountPath: {{ $dir }}/ca, readOnly: true}
{{- if $t.clientCaSecretName }}
- {name: tls-client, mountPath: {{ $dir }}/client, readOnly: true}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* A client's TLS files, as `infer client` / `infer health` flags (the CA, the client certificate, the name). */}}
{{- define "infer.clientTlsArgs" -}}
{{- $t := .Values.tls }}{{- $dir := include "infer.tlsDir" . }}
{{- if $t.secretName }}
{{- $args := list "--tls-ca" (printf "%s/ca/ca.crt" $dir) }}
{{- if $t.clientCaSecretName }}
{{- $args = concat $args (list "--tls-cert" (printf "%s/client/tls.crt" $dir) "--tls-key" (printf "%s/client/tls.key" $dir)) }}
{{- end }}
{{- with $t.serverName }}{{ $args = concat $args (list "--tls-server-name" .) }}{{ end }}
{{- toJson $args }}
{{- else }}[]
{{- end }}
{{- end }}

{{/* The separate gateway reaches TLS model servers with the CA (and, for mTLS, the client certificate). */}}
{{- define "infer.gatewayTlsEnv" -}}
{{- $t := .Values.tls }}{{- $dir := include "infer.tlsDir" . }}
{{- if $t.secretName }}
- name: INFER_UPSTREAM_TLS_CA
  value: {{ printf "%s/ca/ca.crt" $dir | quote }}
{{- if $t.clientCaSecretName }}
- name: INFER_UPSTREAM_TLS_CERT
  value: {{ printf "%s/client/tls.crt" $dir | quote }}
- name: INFER_UPSTREAM_TLS_KEY
  value: {{ printf "%s/client/tls.key" $dir | quote }}
{{- end }}
{{- with $t.serverName }}
- name: INFER_UPSTREAM_TLS_SERVER_NAME
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* An endpoint picker: the port its pool targets, the labels it reads, where it scrapes and subscribes. */}}
{{- define "infer.poolTargetPort" -}}
{{- ternary .Values.ports.grpc .Values.ports.http (eq .Values.inferencePool.protocol "grpc") }}
{{- end }}

{{/* The pod labels of the model servers: the picker's, then podLabels (which win on a shared key). */}}
{{- define "infer.podLabels" -}}
{{- $labels := dict }}
{{- with .Values.picker.engineType }}{{ $_ := set $labels "llm-d.ai/engine-type" . }}{{ end }}
{{- with .Values.picker.role }}{{ $_ := set $labels "llm-d.ai/role" . }}{{ end }}
{{- with merge (deepCopy (.Values.podLabels | default dict)) $labels }}
{{- toYaml . }}
{{- end }}
{{- end }}

{{/* /metrics on the HTTP port too: asked for, or where a pool's picker scrapes by default (its target port). */}}
{{- define "infer.httpMetrics" -}}
{{- $pool := and .Values.inferencePool.enabled (eq .Values.inferencePool.protocol "http") }}
{{- if and (not (include "infer.isSeparateGateway" .)) (or .Values.metrics.onHttpPort $pool) }}true{{ end }}
{{- end }}

{{- define "infer.kvEventsEnv" -}}
{{- if .Values.kvEvents.enabled }}
{{- if eq (toString .Values.config.enable_prefix_caching) "false" }}
{{- fail "kvEvents.enabled needs config.enable_prefix_caching: the events tell which prefix-cache blocks a pod holds" }}
{{- end }}
- name: INFER_KV_EVENTS
  value: "true"
- name: INFER_KV_EVENTS_ENDPOINT
  value: {{ printf "tcp://*:%d" (int .Values.ports.kvEvents) | quote }}
- name: INFER_KV_EVENTS_REPLAY_ENDPOINT
  value: {{ printf "tcp://*:%d" (int .Values.ports.kvEventsReplay) | quote }}
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
# NOTE: the topic's pod id (kv@<pod-id>@<model>) as the picker names an endpoint: its address and target port
- name: INFER_KV_EVENTS_POD_ID
  value: {{ printf "$(POD_IP):%s" (include "infer.poolTargetPort" .) | quote }}
{{- end }}
{{- end }}
