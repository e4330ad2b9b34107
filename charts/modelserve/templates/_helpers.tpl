{{/* The release's object name prefix: the release name when it already says modelserve. */}}
{{- define "modelserve.fullname" -}}
{{- if contains "modelserve" .Release.Name -}}
{{- .Release.Name | trunc 45 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-modelserve" .Release.Name | trunc 45 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "modelserve.labels" -}}
app.kubernetes.io/name: modelserve
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{/* Pod labels of the operator. */}}
{{- define "modelserve.selector" -}}
app.kubernetes.io/name: modelserve
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end -}}

{{/* Pod labels of the mirror. */}}
{{- define "modelserve.mirrorSelector" -}}
app.kubernetes.io/name: modelserve
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: mirror
{{- end -}}

{{/* Pod labels of the gateway. */}}
{{- define "modelserve.gatewaySelector" -}}
app.kubernetes.io/name: modelserve
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: gateway
{{- end -}}

{{- define "modelserve.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "modelserve.pullImage" -}}
{{ .Values.operator.pullImage | default (include "modelserve.image" .) }}
{{- end -}}

{{- define "modelserve.mirrorURL" -}}
{{- if .Values.mirror.url -}}
{{ .Values.mirror.url }}
{{- else -}}
http://{{ include "modelserve.fullname" . }}-mirror.{{ .Release.Namespace }}.svc:{{ .Values.mirror.port }}
{{- end -}}
{{- end -}}

{{/* The default token Secret as NAMESPACE/NAME, or empty. */}}
{{- define "modelserve.defaultTokenSecret" -}}
{{- if and .Values.registry.token .Values.registry.defaultTokenSecret -}}
{{- fail "registry.token and registry.defaultTokenSecret both name the default token: set one of them" -}}
{{- else if .Values.registry.token -}}
{{ .Release.Namespace }}/{{ include "modelserve.fullname" . }}-registry-token
{{- else if contains "/" .Values.registry.defaultTokenSecret -}}
{{ .Values.registry.defaultTokenSecret }}
{{- else if .Values.registry.defaultTokenSecret -}}
{{ .Release.Namespace }}/{{ .Values.registry.defaultTokenSecret }}
{{- end -}}
{{- end -}}

{{/* The container securityContext every container of the chart runs with. */}}
{{- define "modelserve.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities: {drop: ["ALL"]}
seccompProfile: {type: RuntimeDefault}
{{- end -}}
