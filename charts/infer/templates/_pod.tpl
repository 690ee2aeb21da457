{{/* Pieces of the model server pod: probes, resources, the model's volumes and init container. */}}

{{/* Native gRPC probes: on the gRPC port, or with TLS on the plaintext health port (the kubelet has no TLS). */}}
{{- define "infer.serverProbes" -}}
{{- $p := .Values.probes -}}
{{- $port := ternary .Values.ports.health .Values.ports.grpc (not (empty (include "infer.tlsOn" .))) -}}
startupProbe:
  grpc:
    port: {{ $port }}
  periodSeconds: {{ $p.startup.periodSeconds }}
  failureThreshold: {{ $p.startup.failureThreshold }}
  timeoutSeconds: {{ $p.timeoutSeconds }}
readinessProbe:
  grpc:
    port: {{ $port }}
  periodSeconds: {{ $p.readiness.periodSeconds }}
  failureThreshold: {{ $p.readiness.failureThreshold }}
  timeoutSeconds: {{ $p.timeoutSeconds }}
livenessProbe:
  grpc:
    port: {{ $port }}
  periodSeconds: {{ $p.liveness.periodSeconds }}
  failureThreshold: {{ $p.liveness.failureThreshold }}
  timeoutSeconds: {{ $p.timeoutSeconds }}
{{- end }}

{{- define "infer.preStop" -}}
{{- if gt (int .Values.preStopSleepS) 0 }}
lifecycle:
  preStop:
    exec:
      command: ["sleep", {{ int .Values.preStopSleepS | quote }}]
{{- end }}
{{- end }}

{{- define "infer.serverResources" -}}
{{- $resources := deepCopy (.Values.resources | default dict) }}
{{- $gpus := int .Values.gpu.count }}
{{- if gt $gpus 0 }}
{{- $_ := set $resources "limits" (merge (dict "nvidia.com/gpu" $gpus) ($resources.limits | default dict)) }}
{{- $_ := set $resources "requests" (merge (dict "nvidia.com/gpu" $gpus) ($resources.requests | default dict)) }}
{{- end }}
{{- toYaml $resources }}
{{- end }}

{{- define "infer.modelMounts" -}}
- name: tmp
  mountPath: /tmp
{{- include "infer.apiKeysMount" . }}
{{- include "infer.tlsMounts" (list . "server") }}
{{- with .Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- if eq .Values.model.source "pvc" }}
- name: model-store
  mountPath: /mnt/model-store
  readOnly: true
{{- else if eq .Values.model.source "copy" }}
- name: models
  mountPath: /models
  readOnly: true
{{- end }}
{{- end }}

{{- define "infer.modelVolumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: {{ .Values.tmpSizeLimit }}
{{- include "infer.apiKeysVolume" . }}
{{- include "infer.tlsVolumes" (list . "server") }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- $m := .Values.model }}
{{- if eq $m.source "pvc" }}
- name: model-store
  persistentVolumeClaim:
    claimName: {{ required "model.pvc.claimName: the claim holding the model" $m.pvc.claimName }}
    readOnly: true
{{- else if eq $m.source "copy" }}
- name: models
  emptyDir:
    sizeLimit: {{ $m.copy.sizeLimit }}
{{- with $m.copy.volume }}
- name: model-source
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
{{- end }}

{{/* source copy: `cp -R` the model directory into the emptyDir the server reads it from. */}}
{{- define "infer.modelInitContainers" -}}
{{- $m := .Values.model }}
{{- if eq $m.source "copy" }}
{{- $from := required "model.copy.from: the model directory to copy" $m.copy.from }}
- name: copy-model
  image: {{ $m.copy.image | default (include "infer.image" .) | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: ["cp", "-R", {{ ternary (printf "/mnt/model-source/%s" (trimPrefix "/" $from) | clean) $from (not (empty $m.copy.volume)) | quote }}, "/models/"]
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  resources:
    requests:
      cpu: 100m
      memory: 128Mi
    limits:
      memory: 512Mi
  volumeMounts:
    - name: models
      mountPath: /models
    {{- if $m.copy.volume }}
    - name: model-source
      mountPath: /mnt/model-source
      readOnly: true
    {{- end }}
{{- end }}
{{- end }}

{{/* Scheduling of the model server pods; without an affinity, replicas prefer different nodes. */}}
{{- define "infer.serverScheduling" -}}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
affinity:
{{- if .Values.affinity }}
  {{- toYaml .Values.affinity | nindent 2 }}
{{- else }}
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- include "infer.selectorLabels" (list . "server") | nindent 14 }}
{{- end }}
{{- with .Values.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.runtimeClassName }}
runtimeClassName: {{ . }}
{{- end }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end }}
