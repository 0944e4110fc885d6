{{/* Names and labels shared by every template. */}}

{{- define "hubshift.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "hubshift.fullname" -}}
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

{{- define "hubshift.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels: immutable, used in spec.selector only. */}}
{{- define "hubshift.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hubshift.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "hubshift.labels" -}}
helm.sh/chart: {{ include "hubshift.chart" . }}
{{ include "hubshift.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: hubshift
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "hubshift.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "hubshift.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The operator's own identity (`hubshift operator --credential`). */}}
{{- define "hubshift.credential" -}}
{{- if .Values.azure.credential -}}
{{- .Values.azure.credential -}}
{{- else if .Values.azure.workloadIdentity.enabled -}}
workloadIdentity
{{- else -}}
default
{{- end -}}
{{- end -}}

{{- define "hubshift.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Watching all namespaces (a ClusterRole) or only the listed ones (a Role in each). */}}
{{- define "hubshift.clusterwide" -}}
{{- if .Values.operator.watchNamespaces -}}false{{- else -}}true{{- end -}}
{{- end -}}

{{/* The rules the operator needs in every namespace it watches. */}}
{{- define "hubshift.namespacedRules" -}}
# The PartitionedConsumers themselves, their status, and blockOwnerDeletion on their children.
- apiGroups: [hubshift.dev]
  resources: [partitionedconsumers]
  verbs: [get, list, watch, patch, update]
- apiGroups: [hubshift.dev]
  resources: [partitionedconsumers/status]
  verbs: [get, patch, update]
- apiGroups: [hubshift.dev]
  resources: [partitionedconsumers/finalizers]
  verbs: [update]
# The children (server-side apply is `patch`; garbage collection deletes them, not the operator).
- apiGroups: [apps]
  resources: [statefulsets]
  verbs: [get, list, watch, create, patch, update]
- apiGroups: [apps]
  resources: [statefulsets/scale]
  verbs: [get, patch, update]
- apiGroups: [""]
  resources: [services, configmaps]
  verbs: [get, list, watch, create, patch, update]
# The consumer pods' ServiceAccount when a spec uses a token credential: created when missing, an existing
# one only read (never changed, never owned).
- apiGroups: [""]
  resources: [serviceaccounts]
  verbs: [get, create, patch]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, watch, create, patch, update]
# Consumer pods: watched, never changed.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
# The Event Hubs and storage connection strings the CRs name: read one by one, never listed.
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end -}}
