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
- name: INFER_SHUTDOWN_GRACE_S
  value: {{ include "infer.envValue" .Values.shutdownGraceS }}
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
