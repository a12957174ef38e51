{{/* Chart name, overridable. */}}
{{- define "gpu-dra.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* "<release>-<chart>" prefix of object names; the release name alone when it already holds the chart name. */}}
{{- define "gpu-dra.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := include "gpu-dra.name" . }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Namespace of the namespaced objects. */}}
{{- define "gpu-dra.namespace" -}}
{{- default .Release.Namespace .Values.namespace.name }}
{{- end }}

{{- define "gpu-dra.serviceAccountName" -}}
{{- default (printf "%s-kubelet-plugin" (include "gpu-dra.fullname" .)) .Values.serviceAccount.name }}
{{- end }}

{{/* Labels every object carries. */}}
{{- define "gpu-dra.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: {{ include "gpu-dra.name" . }}
{{ include "gpu-dra.selectorLabels" . }}
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
{{- end }}

{{/* Labels that select the kubelet plugin pods; immutable once installed. */}}
{{- define "gpu-dra.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-dra.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The CEL selector every class of this driver starts from: full GPUs of our driver. */}}
{{- define "gpu-dra.gpuSelector" -}}
device.driver == {{ .Values.driverName | quote }} && device.attributes[{{ .Values.driverName | quote }}].type == "gpu"
{{- end }}

{{/* The CEL selector of the MIG class: MIG devices of our driver. */}}
{{- define "gpu-dra.migSelector" -}}
device.driver == {{ .Values.driverName | quote }} && device.attributes[{{ .Values.driverName | quote }}].type == "mig"
{{- end }}

{{- /*
The DRA drivers the kubelet plugin serves, as a JSON (and CEL) list: its GPU driver, and with
computeDomains.enabled the ComputeDomain node driver it serves from the same process. The
admission policies let it write those drivers' slices and publisher Leases only.
*/}}
{{- define "gpu-dra.pluginDrivers" -}}
{{- $drivers := list .Values.driverName }}
{{- if .Values.computeDomains.enabled }}
{{- $drivers = append $drivers "compute-domain.nvidia.com" }}
{{- end }}
{{- toJson $drivers }}
{{- end }}
