module github.com/outboxrelay/relay/deploy/chartcheck

go 1.26.0

require helm.sh/helm/v4 v4.3.2 // indirect
