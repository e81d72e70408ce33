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

{{/* The dynamo image: the operator's own, and what it passes as --image (so the
default of the sidecar, EPP, planner and mocker images). A digest wins over the tag. */}}
{{- define "dynamo-platform.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* The namespace a namespace-scoped operator watches: namespaceScoped.namespace, or the
release's. */}}
{{- define "dynamo-platform.watchNamespace" -}}
{{- .Values.namespaceScoped.namespace | default .Release.Namespace -}}
{{- end -}}

{{/* The cluster-wide CRD role of a namespace-scoped release, one per watched namespace. */}}
{{- define "dynamo-platform.conversionRoleName" -}}
{{- printf "%s-%s-crd" (include "dynamo-platform.fullname" .) (include "dynamo-platform.watchNamespace" .) | trunc 253 -}}
{{- end -}}

{{/* Leader election is on exactly when more than one replica runs. */}}
{{- define "dynamo-platform.leaderElect" -}}
{{- if gt (int .Values.replicaCount) 1 }}true{{ end -}}
{{- end -}}
