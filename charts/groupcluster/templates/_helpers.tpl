{{/* Names and labels shared by the templates. */}}
{{- define "groupcluster.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "groupcluster.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "groupcluster.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "groupcluster.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "groupcluster.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The operator's namespaces: every one, or the release namespace plus watchNamespaces. */}}
{{- define "groupcluster.watchArgs" -}}
{{- if .Values.rbac.clusterWide -}}
- --all-namespaces
{{- else -}}
{{- range $i, $ns := prepend .Values.watchNamespaces $.Release.Namespace | uniq }}
{{- if $i }}
{{ end -}}
- --namespace={{ $ns }}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "groupcluster.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/*
The operator's rights, least privilege: GroupClusters (kopf adds its finalizer and annotations, the operator
writes the status), the member pods and the objects it creates for each cluster (the auth Secret: get and
create only), and events.
*/}}
{{- define "groupcluster.rules" -}}
- apiGroups: ["groupcluster.io"]
  resources: ["groupclusters"]
  verbs: ["get", "list", "watch", "patch", "update"]
- apiGroups: ["groupcluster.io"]
  resources: ["groupclusters/status"]
  verbs: ["get", "patch", "update"]
- apiGroups: [""]
  resources: ["pods"]
  # list: also what the members' Role grants, which the operator may only grant if it holds it itself.
  verbs: ["get", "list", "create", "delete", "patch"]
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["get", "create"]
# delete: a cluster's headless Service that an older operator named NAME is replaced by the client Service NAME.
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "create", "delete"]
# Each GroupCluster's auth Secret (NAME-auth, or spec.auth.existingSecret): get reads the admin token and checks
# the keys by name; create makes NAME-auth once. No list or watch (the operator never needs all the namespace's
# Secrets), no update, patch or delete (it never rewrites keys; the garbage collector removes NAME-auth).
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "create"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "create"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "create", "patch"]
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create"]
# kopf's peering of the operator replicas (create: the operator makes a missing peering object itself).
- apiGroups: ["kopf.dev"]
  resources: ["{{ if .Values.rbac.clusterWide }}cluster{{ end }}kopfpeerings"]
  verbs: ["get", "list", "watch", "patch", "create"]
{{- end -}}
