{{/* Names, labels, images and the RBAC rules of the hacrl-operator chart. */}}

{{- define "hacrl-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "hacrl-operator.fullname" -}}
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

{{/*
Names of cluster-scoped objects (ClusterRoles and their bindings, the admission policy): the
fullname and the release namespace, so that installs of the same release name in two namespaces
(one per team, each watching its own namespaces) own distinct objects; Helm refuses to install
an object of the same name that another release owns.
*/}}
{{- define "hacrl-operator.clusterName" -}}
{{- printf "%s-%s" (include "hacrl-operator.fullname" .) .Release.Namespace }}
{{- end }}

{{- define "hacrl-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "hacrl-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hacrl-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "hacrl-operator.labels" -}}
helm.sh/chart: {{ include "hacrl-operator.chart" . }}
{{ include "hacrl-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: hacrl
{{- end }}

{{- define "hacrl-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "hacrl-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false: name an existing ServiceAccount" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* An image reference from {repository, tag, digest}; the tag defaults to the appVersion. */}}
{{- define "hacrl-operator.image" -}}
{{- $image := index . 0 }}{{- $root := index . 1 }}
{{- $ref := printf "%s:%s" $image.repository (default $root.Chart.AppVersion $image.tag) }}
{{- if $image.digest }}{{ printf "%s@%s" $ref $image.digest }}{{ else }}{{ $ref }}{{ end }}
{{- end }}

{{/*
MinIO: fixed names, the same whatever the release is called (Deployment, Service, Secret:
hacrl-minio), so that examples and docs can rely on them and the default store below is the same
for every install. One in-chart MinIO per namespace.
*/}}
{{- define "hacrl-operator.minio.fullname" -}}
hacrl-minio
{{- end }}

{{- define "hacrl-operator.minio.secretName" -}}
{{- default (include "hacrl-operator.minio.fullname" .) .Values.minio.existingSecret }}
{{- end }}

{{/* The namespaces the in-chart MinIO serves, comma-separated: the release namespace, the watched namespaces, minio.secretNamespaces. */}}
{{- define "hacrl-operator.minio.namespaces" -}}
{{- $namespaces := concat (list .Release.Namespace) (.Values.watchNamespaces | default list) (.Values.minio.secretNamespaces | default list) }}
{{- join "," (uniq $namespaces) }}
{{- end }}

{{- define "hacrl-operator.minio.endpoint" -}}
{{- printf "http://%s.%s.svc:%d" (include "hacrl-operator.minio.fullname" .) .Release.Namespace (int .Values.minio.service.port) }}
{{- end }}

{{- define "hacrl-operator.minio.selectorLabels" -}}
app.kubernetes.io/name: minio
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
The default store filled into experiments without spec.store, as a dict (empty: none):
defaultStore when its uri is set, else the in-chart MinIO's bucket when minio.enabled.
(`| default dict`: `helm upgrade --reuse-values` from a release before defaultStore existed
does not bring the chart's new defaults.)
*/}}
{{- define "hacrl-operator.defaultStore" -}}
{{- $values := .Values.defaultStore | default dict }}
{{- if $values.uri }}
{{- toJson (pick $values "uri" "endpoint" "region" "credentialsSecret") }}
{{- else if .Values.minio.enabled }}
{{- toJson (dict "uri" (printf "s3://%s" .Values.minio.bucket) "endpoint" (include "hacrl-operator.minio.endpoint" .) "region" "us-east-1" "credentialsSecret" (include "hacrl-operator.minio.secretName" .)) }}
{{- else }}
{{- toJson dict }}
{{- end }}
{{- end }}

{{/* The operator's store credentials Secret: store.credentialsSecret, else the default store's. */}}
{{- define "hacrl-operator.store.credentialsSecret" -}}
{{- if .Values.store.credentialsSecret }}
{{- .Values.store.credentialsSecret }}
{{- else }}
{{- (include "hacrl-operator.defaultStore" . | fromJson).credentialsSecret | default "" }}
{{- end }}
{{- end }}

{{/*
The operator's permissions: EXACTLY hacrl_operator.rbac.RULES (operator/hacrl_operator/rbac.py).
tests/chart/test_rbac.py fails when these and RULES differ in either direction.
"namespaceRules" are needed in every watched namespace; "clusterRules" only when watching all namespaces.
*/}}
{{- define "hacrl-operator.namespaceRules" -}}
- apiGroups: ["hacrl.io"]
  resources: ["hacrlexperiments"]
  verbs: ["get", "list", "watch", "patch", "delete"]
- apiGroups: ["hacrl.io"]
  resources: ["hacrlexperiments/status"]
  verbs: ["patch"]
- apiGroups: ["hacrl.io"]
  resources: ["hacrlexperiments/finalizers"]
  verbs: ["update"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "delete"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "create", "delete"]
- apiGroups: ["scheduling.volcano.sh"]
  resources: ["podgroups"]
  verbs: ["get", "create", "patch", "delete"]
{{- end }}

{{- /* "leaseRules": in the release namespace, where the leader-election Lease is (leaderElection.enabled). */}}
{{- define "hacrl-operator.leaseRules" -}}
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  verbs: ["get", "create", "patch"]
{{- end }}

{{- define "hacrl-operator.clusterRules" -}}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
{{- end }}

{{/* Checks of value combinations; each message names the value path to change. */}}
{{- define "hacrl-operator.validate" -}}
{{- if and (gt (int .Values.replicas) 1) (not .Values.leaderElection.enabled) }}
{{- fail (printf "replicas=%v needs leaderElection.enabled=true: without an elected leader every replica would act on every experiment; set replicas=1 or enable leaderElection" .Values.replicas) }}
{{- end }}
{{- if .Values.leaderElection.enabled }}
{{- if not (lt (float64 .Values.leaderElection.renewDeadline) (float64 .Values.leaderElection.leaseDuration)) }}
{{- fail (printf "leaderElection.renewDeadline (%v) must be less than leaderElection.leaseDuration (%v): a leader must stop acting before a standby may take its Lease" .Values.leaderElection.renewDeadline .Values.leaderElection.leaseDuration) }}
{{- end }}
{{- if not (lt (mulf (float64 .Values.leaderElection.retryPeriod) 1.2) (float64 .Values.leaderElection.renewDeadline)) }}
{{- fail (printf "leaderElection.retryPeriod (%v) must be under leaderElection.renewDeadline / 1.2: a leader needs more than one try to renew before its deadline" .Values.leaderElection.retryPeriod) }}
{{- end }}
{{- end }}
{{- if and .Values.metrics.serviceMonitor.enabled (eq (int .Values.metrics.port) 0) }}
{{- fail "metrics.serviceMonitor.enabled=true needs the operator's metrics: set metrics.port to a port (e.g. 8081), or metrics.serviceMonitor.enabled=false" }}
{{- end }}
{{- if and .Values.metrics.serviceMonitor.enabled (not .Values.metrics.service.enabled) }}
{{- fail "metrics.serviceMonitor.enabled=true scrapes the metrics Service: set metrics.service.enabled=true" }}
{{- end }}
{{- if and .Values.watchTimeouts.client (le (int .Values.watchTimeouts.client) (int .Values.watchTimeouts.server)) }}
{{- fail (printf "watchTimeouts.client (%v) must be greater than watchTimeouts.server (%v), or 0 for server + 30" .Values.watchTimeouts.client .Values.watchTimeouts.server) }}
{{- end }}
{{- if eq (int .Values.health.port) (int .Values.metrics.port) }}
{{- fail (printf "health.port and metrics.port are both %v: give them different ports" .Values.health.port) }}
{{- end }}
{{- if and .Values.minio.existingSecret .Values.minio.secretNamespaces }}
{{- fail "minio.secretNamespaces copies only a generated Secret: with minio.existingSecret, create that Secret in those namespaces yourself and leave minio.secretNamespaces empty" }}
{{- end }}
{{- if and .Values.minio.secretNamespaces (not .Values.minio.enabled) }}
{{- fail "minio.secretNamespaces is set but minio.enabled is false: enable MinIO or remove minio.secretNamespaces" }}
{{- end }}
{{- $defaultStore := .Values.defaultStore | default dict }}
{{- if and (not $defaultStore.uri) (or $defaultStore.endpoint $defaultStore.region $defaultStore.credentialsSecret) }}
{{- fail "defaultStore.endpoint, defaultStore.region and defaultStore.credentialsSecret need defaultStore.uri: set defaultStore.uri (e.g. s3://bucket), or leave them all empty" }}
{{- end }}
{{- end }}

{{/* Secrets experiments may name: the admin's list, plus the in-chart MinIO's and the default store's Secret. */}}
{{- define "hacrl-operator.experimentSecrets" -}}
{{- $secrets := .Values.experimentSecrets | default list -}}
{{- if .Values.minio.enabled -}}
{{- $secrets = append $secrets (include "hacrl-operator.minio.secretName" .) -}}
{{- end -}}
{{- with (include "hacrl-operator.defaultStore" . | fromJson).credentialsSecret -}}
{{- $secrets = append $secrets . -}}
{{- end -}}
{{- join "," (uniq $secrets) -}}
{{- end }}
