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

{{/* The image of the operator and, unless a PartitionedConsumer pins its own, of the consumer pods:
[registry/]repository, then @digest or :tag (default the chart's appVersion). The registry defaults to an
umbrella chart's global.imageRegistry. */}}
{{- define "hubshift.image" -}}
{{- $global := .Values.global | default dict -}}
{{- $registry := .Values.image.registry | default $global.imageRegistry | default "" -}}
{{- $repository := .Values.image.repository -}}
{{- if $registry -}}
{{- $repository = printf "%s/%s" (trimSuffix "/" $registry) $repository -}}
{{- end -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" $repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* imagePullSecrets, with an umbrella chart's global.imagePullSecrets (names or {name: ...}). */}}
{{- define "hubshift.imagePullSecrets" -}}
{{- $global := .Values.global | default dict -}}
{{- $secrets := list -}}
{{- range concat (.Values.imagePullSecrets | default list) ($global.imagePullSecrets | default list) -}}
{{- $secrets = append $secrets (kindIs "string" . | ternary (dict "name" .) .) -}}
{{- end -}}
{{- if $secrets -}}
{{- toYaml (uniq $secrets) -}}
{{- end -}}
{{- end -}}

{{/* The namespaces the operator watches, as JSON (`include ... | fromJsonArray`): operator.watchNamespaces,
plus the release's namespace with operator.watchReleaseNamespace. None: every namespace. */}}
{{- define "hubshift.watchedNamespaces" -}}
{{- $namespaces := .Values.operator.watchNamespaces | default list -}}
{{- if .Values.operator.watchReleaseNamespace -}}
{{- $namespaces = append $namespaces .Release.Namespace | uniq -}}
{{- end -}}
{{- toJson $namespaces -}}
{{- end -}}

{{/* Watching all namespaces (a ClusterRole) or only the watched ones (a Role in each). */}}
{{- define "hubshift.clusterwide" -}}
{{- if include "hubshift.watchedNamespaces" . | fromJsonArray -}}false{{- else -}}true{{- end -}}
{{- end -}}

{{/* The rules the operator needs in every namespace it watches. */}}
{{- define "hubshift.namespacedRules" -}}
# Exactly what the operator asks (tests/cluster/test_operator_rbac.py compares the API server's audit log
# with these): kopf lists, watches and patches the PartitionedConsumers (its finalizer and annotations),
# the status is applied server-side (patch), children are applied server-side (patch creates them too) and
# garbage-collected (never deleted here).
- apiGroups: [hubshift.dev]
  resources: [partitionedconsumers]
  verbs: [list, watch, patch]
- apiGroups: [hubshift.dev]
  resources: [partitionedconsumers/status]
  verbs: [patch]
# Not a request of the operator's: the OwnerReferencesPermissionEnforcement admission plugin (OpenShift and
# some managed clusters) checks it when a child sets blockOwnerDeletion.
- apiGroups: [hubshift.dev]
  resources: [partitionedconsumers/finalizers]
  verbs: [update]
# A server-side apply that creates a child is authorized as create as well (the audit log records it as
# the patch it is).
- apiGroups: [apps]
  resources: [statefulsets]
  verbs: [get, create, patch]
- apiGroups: [apps]
  resources: [statefulsets/scale]
  verbs: [patch]
- apiGroups: [""]
  resources: [services, configmaps]
  verbs: [create, patch]
# The consumer pods' ServiceAccount when a spec uses a token credential: created when missing, an existing
# one only read (never changed, never owned).
- apiGroups: [""]
  resources: [serviceaccounts]
  verbs: [get, create, patch]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [create, patch]
# Consumer pods: watched, never changed; a rollout the operator drives evicts each one once it holds no
# partition (the Eviction API, so the PodDisruptionBudget counts it, as `kubectl drain` does).
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch]
- apiGroups: [""]
  resources: [pods/eviction]
  verbs: [create]
# The Event Hubs and storage connection strings the CRs name: read one by one, never listed.
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- end -}}

{{/* The operator's --access file: operator.access (what it reads with its own identity, per namespace) and
operator.allowedServiceAccounts (the existing ServiceAccounts consumer pods may run as, per namespace). */}}
{{- define "hubshift.accessDocument" -}}
{{- $document := deepCopy (.Values.operator.access | default dict) -}}
{{- $_ := set $document "allowedServiceAccounts" (.Values.operator.allowedServiceAccounts | default dict) -}}
{{- toYaml $document -}}
{{- end -}}
