#!/bin/sh
# Writes the git-ignored env files kustomization.yaml's secretGenerator reads, with fresh random secrets, then checks
# them: it exits 1, naming the file and the key, while any value still holds a CHANGE_ME placeholder or MinIO's
# default minioadmin. Run it again after editing a file: existing files are kept and checked, never overwritten.
#   strata-secrets.env       the pods': full-access API key, the metrics-only key's grant, the Milvus user strata's
#                            token, the serving role's PostgreSQL URL, the Redis URL
#   strata-migration.env     the migration Job's: the PostgreSQL URL of the role that owns the tables (DDL)
#   strata-metrics.env       Prometheus's: the metrics-only key (servicemonitor.yaml)
#   milvus-credentials.env   MinIO's keys and Milvus's root password (the chart; the Job jobs/milvus-user)
# The database and Redis URLs come from the environment (else CHANGE_ME placeholders to fill in):
#   STRATA_DATABASE__URL=postgresql+psycopg://strata_app:...@host:5432/strata \
#   MIGRATION_DATABASE_URL=postgresql+psycopg://strata:...@host:5432/strata \
#   STRATA_REDIS__URL=redis://:...@host:6379/0 deploy/k8s/make-secrets.sh [DIR]   # DIR defaults to this folder
set -eu
dir=${1:-$(dirname "$0")}
files="strata-secrets.env strata-migration.env strata-metrics.env milvus-credentials.env"
random() { od -An -tx1 -N24 /dev/urandom | tr -d ' \n'; }

write_all() {
  umask 077
  metrics_key=$(random)
  cat > "$dir/milvus-credentials.env" <<END
accesskey=strata
secretkey=$(random)
rootpassword=$(random)
END
  cat > "$dir/strata-secrets.env" <<END
STRATA_API__API_KEY=$(random)
STRATA_API__KEYS={"$metrics_key": {"metrics": true}}
STRATA_MILVUS__TOKEN=strata:$(random)
STRATA_DATABASE__URL=${STRATA_DATABASE__URL:-postgresql+psycopg://strata_app:CHANGE_ME@postgres.strata.svc:5432/strata}
STRATA_REDIS__URL=${STRATA_REDIS__URL:-redis://:CHANGE_ME@redis.strata.svc:6379/0}
END
  cat > "$dir/strata-migration.env" <<END
STRATA_DATABASE__URL=${MIGRATION_DATABASE_URL:-postgresql+psycopg://strata:CHANGE_ME@postgres.strata.svc:5432/strata}
END
  cat > "$dir/strata-metrics.env" <<END
token=$metrics_key
END
  echo "wrote $dir/{strata-secrets,strata-migration,strata-metrics,milvus-credentials}.env"
}

# Every value of one env file must be real: no CHANGE_ME placeholder, not MinIO's well-known default.
check() {
  ok=0
  while IFS= read -r line || [ -n "$line" ]; do
    case $line in '' | '#'*) continue ;; esac
    key=${line%%=*}
    case ${line#*=} in
      *CHANGE_ME*) echo "$1: $key still holds a CHANGE_ME placeholder: set it" >&2; ok=1 ;;
      *minioadmin*) echo "$1: $key is MinIO's default minioadmin: choose another" >&2; ok=1 ;;
    esac
  done < "$1"
  return $ok
}

present=0
for name in $files; do [ -e "$dir/$name" ] && present=$((present + 1)); done
if [ "$present" -eq 0 ]; then
  write_all
elif [ "$present" -lt 4 ]; then  # the files refer to each other (the metrics key): made together or not at all
  for name in $files; do
    [ -e "$dir/$name" ] || echo "$dir/$name is missing: copy it from $(dirname "$0")/$name.example and fill it in" >&2
  done
  exit 1
else
  echo "kept the existing files of $dir (delete them to make new secrets)"
fi
status=0
for name in $files; do check "$dir/$name" || status=1; done
[ "$status" -eq 0 ] && echo "no placeholder left: ready for kubectl apply -k"
exit "$status"
