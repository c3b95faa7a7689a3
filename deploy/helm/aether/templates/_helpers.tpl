{{/* The two labels every object of deploy/ carries: aether.labels "aether-node" */}}
{{- define "aether.labels" -}}
app.kubernetes.io/name: {{ . }}
app.kubernetes.io/part-of: aether
{{- end }}

{{/* repository:tag of images.<which>, the tag defaulting to the chart's appVersion: aether.image (list $ "node") */}}
{{- define "aether.image" -}}
{{- $root := index . 0 -}}
{{- $image := index $root.Values.images (index . 1) -}}
{{- printf "%s:%s" $image.repository (default $root.Chart.AppVersion $image.tag) -}}
{{- end }}

{{/* The node ServiceAccount's user name, as the API server reports it in request.userInfo.username */}}
{{- define "aether.nodeUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:aether-node
{{- end }}

{{/* true when certificates.dir lies under /run/aether, which the xds container mounts already */}}
{{- define "aether.certsUnderRun" -}}
{{- $dir := clean .Values.certificates.dir -}}
{{- if or (eq $dir "/run/aether") (hasPrefix "/run/aether/" $dir) }}true{{ end -}}
{{- end }}
