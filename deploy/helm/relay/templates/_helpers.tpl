{{- define "relay.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "relay.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "relay.labels" -}}
{{ include "relay.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "relay.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The combinations the relay would refuse, refused at install time. */}}
{{- define "relay.validate" -}}
{{- if not .Values.database.existingSecret -}}
{{- fail "database.existingSecret: name the Secret holding the PostgreSQL URL (kubectl create secret generic NAME --from-literal=url=postgres://...)" -}}
{{- end -}}
{{- if and (eq .Values.sink.type "embedded") (gt (int .Values.replicaCount) 1) -}}
{{- fail "replicaCount > 1 needs sink.type=kafka: an embedded broker's standby opens the leader's own data directory, which a ReadWriteOnce volume cannot share across nodes (see deploy/README.md)" -}}
{{- end -}}
{{- if and (eq .Values.sink.type "kafka") (not .Values.sink.kafka.brokers) -}}
{{- fail "sink.type=kafka needs sink.kafka.brokers" -}}
{{- end -}}
{{- if and .Values.sink.kafka.sasl.mechanism (not .Values.sink.kafka.sasl.existingSecret) -}}
{{- fail "sink.kafka.sasl.mechanism needs sink.kafka.sasl.existingSecret (the password's Secret)" -}}
{{- end -}}
{{- if and .Values.listener.tls.enabled (not .Values.listener.tls.existingSecret) -}}
{{- fail "listener.tls.enabled needs listener.tls.existingSecret (a kubernetes.io/tls Secret)" -}}
{{- end -}}
{{- if and .Values.listener.sasl.enabled (not .Values.listener.sasl.usersSecret) -}}
{{- fail "listener.sasl.enabled needs listener.sasl.usersSecret (the users file of relay listener-users)" -}}
{{- end -}}
{{- end -}}

{{- define "relay.embedded" -}}
{{- if eq .Values.sink.type "embedded" }}true{{ end -}}
{{- end -}}

{{- define "relay.advertisedAddress" -}}
{{- .Values.listener.advertisedAddress | default (printf "%s.%s.svc.cluster.local:%d" (include "relay.fullname" .) .Release.Namespace (int .Values.listener.port)) -}}
{{- end -}}

{{- define "relay.readinessPath" -}}
{{- .Values.probes.readiness.path | default (ternary "/readyz" "/healthz" (eq (int .Values.replicaCount) 1)) -}}
{{- end -}}

{{/* The pod template of the relay: every setting as a flag, every secret from a Secret. */}}
{{- define "relay.podTemplate" -}}
metadata:
  labels:
    {{- include "relay.selectorLabels" . | nindent 4 }}
  {{- with .Values.podAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: {{ .Values.terminationGracePeriodSeconds }}
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    runAsNonRoot: true
    runAsUser: 65532
    runAsGroup: 65532
    fsGroup: 65532
    seccompProfile:
      type: RuntimeDefault
  containers:
    - name: relay
      image: {{ include "relay.image" . | quote }}
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      args:
        - run
        - --schema={{ .Values.schema }}
        - --source={{ .Values.source.type }}
        {{- if eq .Values.source.type "cdc" }}
        {{- with .Values.source.cdc.slot }}
        - --slot={{ . }}
        {{- end }}
        {{- with .Values.source.cdc.publication }}
        - --publication={{ . }}
        {{- end }}
        {{- end }}
        - --sink={{ .Values.sink.type }}
        - --http-addr=0.0.0.0:{{ .Values.http.port }}
        - --shutdown-timeout={{ .Values.shutdownTimeout }}
        {{- if include "relay.embedded" . }}
        - --data-dir=/data
        - --kafka-addr=0.0.0.0:{{ .Values.listener.port }}
        - --kafka-advertised-addr={{ include "relay.advertisedAddress" . }}
        {{- if .Values.listener.tls.enabled }}
        - --listener-tls-cert-file=/etc/relay/listener-tls/tls.crt
        - --listener-tls-key-file=/etc/relay/listener-tls/tls.key
        {{- if .Values.listener.tls.clientAuth }}
        - --listener-tls-client-ca-file=/etc/relay/listener-tls/ca.crt
        {{- end }}
        {{- end }}
        {{- if .Values.listener.sasl.enabled }}
        - --listener-users-file=/etc/relay/listener-users/{{ .Values.listener.sasl.usersKey }}
        - --listener-sasl-mechanisms={{ .Values.listener.sasl.mechanisms }}
        {{- with .Values.listener.sasl.superUsers }}
        - --listener-super-users={{ . }}
        {{- end }}
        {{- end }}
        {{- if .Values.listener.acls.enabled }}
        - --listener-acl-file=/data/acls.json
        - --listener-acl-default={{ .Values.listener.acls.default }}
        {{- end }}
        {{- else }}
        - --kafka-brokers={{ join "," .Values.sink.kafka.brokers }}
        {{- if .Values.sink.kafka.createTopics }}
        - --kafka-create-topics
        {{- end }}
        {{- with .Values.sink.kafka.transactionalId }}
        - --kafka-transactional-id={{ . }}
        {{- end }}
        {{- if .Values.sink.kafka.tls.enabled }}
        - --kafka-tls
        {{- if .Values.sink.kafka.tls.existingSecret }}
        - --kafka-tls-ca-file=/etc/relay/kafka-tls/ca.crt
        {{- if .Values.sink.kafka.tls.clientCert }}
        - --kafka-tls-cert-file=/etc/relay/kafka-tls/tls.crt
        - --kafka-tls-key-file=/etc/relay/kafka-tls/tls.key
        {{- end }}
        {{- end }}
        {{- end }}
        {{- with .Values.sink.kafka.sasl.mechanism }}
        - --kafka-sasl-mechanism={{ . }}
        - --kafka-sasl-user={{ $.Values.sink.kafka.sasl.user }}
        {{- end }}
        {{- end }}
        {{- with .Values.extraArgs }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      env:
        - name: RELAY_DATABASE_URL
          valueFrom:
            secretKeyRef:
              name: {{ .Values.database.existingSecret }}
              key: {{ .Values.database.key }}
        {{- if and (not (include "relay.embedded" .)) .Values.sink.kafka.sasl.mechanism }}
        - name: RELAY_KAFKA_SASL_PASSWORD
          valueFrom:
            secretKeyRef:
              name: {{ .Values.sink.kafka.sasl.existingSecret }}
              key: {{ .Values.sink.kafka.sasl.passwordKey }}
        {{- end }}
        {{- with .Values.goMemLimit }}
        - name: GOMEMLIMIT
          value: {{ . | quote }}
        {{- end }}
        {{- with .Values.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      ports:
        - name: http
          containerPort: {{ .Values.http.port }}
        {{- if include "relay.embedded" . }}
        - name: kafka
          containerPort: {{ .Values.listener.port }}
        {{- end }}
      {{- if .Values.probes.startup.enabled }}
      startupProbe:
        httpGet:
          path: /healthz
          port: http
        periodSeconds: {{ .Values.probes.startup.periodSeconds }}
        failureThreshold: {{ .Values.probes.startup.failureThreshold }}
      {{- end }}
      {{- if .Values.probes.liveness.enabled }}
      livenessProbe:
        httpGet:
          path: /healthz
          port: http
        periodSeconds: {{ .Values.probes.liveness.periodSeconds }}
        timeoutSeconds: {{ .Values.probes.liveness.timeoutSeconds }}
        failureThreshold: {{ .Values.probes.liveness.failureThreshold }}
      {{- end }}
      {{- if .Values.probes.readiness.enabled }}
      readinessProbe:
        httpGet:
          path: {{ include "relay.readinessPath" . }}
          port: http
        periodSeconds: {{ .Values.probes.readiness.periodSeconds }}
        timeoutSeconds: {{ .Values.probes.readiness.timeoutSeconds }}
        failureThreshold: {{ .Values.probes.readiness.failureThreshold }}
      {{- end }}
      {{- with .Values.resources }}
      resources:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        runAsNonRoot: true
        allowPrivilegeEscalation: false
        readOnlyRootFilesystem: true
        capabilities:
          drop: [ALL]
      volumeMounts:
        - name: tmp
          mountPath: /tmp
        {{- if include "relay.embedded" . }}
        - name: data
          mountPath: /data
        {{- if .Values.listener.tls.enabled }}
        - name: listener-tls
          mountPath: /etc/relay/listener-tls
          readOnly: true
        {{- end }}
        {{- if .Values.listener.sasl.enabled }}
        - name: listener-users
          mountPath: /etc/relay/listener-users
          readOnly: true
        {{- end }}
        {{- else if and .Values.sink.kafka.tls.enabled .Values.sink.kafka.tls.existingSecret }}
        - name: kafka-tls
          mountPath: /etc/relay/kafka-tls
          readOnly: true
        {{- end }}
  {{- with .Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if .Values.affinity }}
  affinity:
    {{- toYaml .Values.affinity | nindent 4 }}
  {{- else if gt (int .Values.replicaCount) 1 }}
  # Leader and standbys on different nodes.
  affinity:
    podAntiAffinity:
      preferredDuringSchedulingIgnoredDuringExecution:
        - weight: 100
          podAffinityTerm:
            topologyKey: kubernetes.io/hostname
            labelSelector:
              matchLabels:
                {{- include "relay.selectorLabels" . | nindent 16 }}
  {{- end }}
  volumes:
    - name: tmp
      emptyDir:
        sizeLimit: 1Gi
    {{- if and (include "relay.embedded" .) (not .Values.persistence.enabled) }}
    - name: data
      emptyDir: {}
    {{- end }}
    {{- if and (include "relay.embedded" .) .Values.listener.tls.enabled }}
    - name: listener-tls
      secret:
        secretName: {{ .Values.listener.tls.existingSecret }}
    {{- end }}
    {{- if and (include "relay.embedded" .) .Values.listener.sasl.enabled }}
    - name: listener-users
      secret:
        secretName: {{ .Values.listener.sasl.usersSecret }}
    {{- end }}
    {{- if and (not (include "relay.embedded" .)) .Values.sink.kafka.tls.enabled .Values.sink.kafka.tls.existingSecret }}
    - name: kafka-tls
      secret:
        secretName: {{ .Values.sink.kafka.tls.existingSecret }}
    {{- end }}
{{- end -}}
