{{/* Full name of the release's objects, at most 63 characters. */}}
{{- define "dynamo-platform.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "dynamo-platform.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "dynamo-platform.labels" -}}
{{ include "dynamo-platform.selectorLabels" . }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "dynamo-platform.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "dynamo-platform.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The dynamo image: the operator's own, and what it passes as --image. */}}
{{- define "dynamo-platform.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* Leader election is on exactly when more than one replica runs. */}}
{{- define "dynamo-platform.leaderElect" -}}
{{- if gt (int .Values.replicaCount) 1 }}true{{ end -}}
{{- end -}}
