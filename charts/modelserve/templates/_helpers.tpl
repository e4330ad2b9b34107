{{- define "modelserve.name" -}}modelserve{{- end -}}
{{- define "modelserve.fullname" -}}{{ .Release.Name }}-modelserve{{- end -}}
{{- define "modelserve.labels" -}}
app.kubernetes.io/name: modelserve
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}
{{- define "modelserve.selector" -}}
app.kubernetes.io/name: modelserve
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end -}}
