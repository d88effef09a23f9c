#!/bin/sh
# Writes the git-ignored env files kustomization.yaml's secretGenerator reads, with fresh random secrets, then checks
# them: it exits 1, naming the file and the key, while any value still holds a CHANGE_ME placeholder or MinIO's
# default minioadmin. Run it again after editing a file: existing files are kept and checked, never overwritten.
# The previous release's pair (strata-secrets.env with root's Milvus token and the tables' owner as its database
# URL, and milvus-credentials.env) is upgraded: the owner's URL moves to strata-migration.env, the pods get the
# serving role's URL (STRATA_DATABASE__URL, else a CHANGE_ME to fill in), the Milvus user strata instead of root
# and a metrics-only key (strata-metrics.env); the old file is kept as strata-secrets.previous.env.
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

# The previous release's strata-secrets.env and milvus-credentials.env, brought to this release's four files.
upgrade_previous() {
  umask 077
  old="$dir/strata-secrets.env"
  if grep -q '^STRATA_API__KEYS=' "$old"; then
    echo "$old sets STRATA_API__KEYS already: add the metrics-only key to it by hand and write" \
      "strata-migration.env and strata-metrics.env from their .example (docs/deploy.md, \"Upgrading the secrets\")" >&2
    exit 1
  fi
  owner_url=$(sed -n 's/^STRATA_DATABASE__URL=//p' "$old")
  serving_url=${STRATA_DATABASE__URL:-$(printf '%s' "$owner_url" | sed 's#//[^@/]*@#//strata_app:CHANGE_ME@#')}
  metrics_key=$(random)
  cp "$old" "$dir/strata-secrets.previous.env"
  {
    grep -v -e '^STRATA_DATABASE__URL=' -e '^STRATA_MILVUS__TOKEN=root:' "$dir/strata-secrets.previous.env" || true
    grep -q '^STRATA_MILVUS__TOKEN=root:' "$old" && echo "STRATA_MILVUS__TOKEN=strata:$(random)"
    echo "STRATA_API__KEYS={\"$metrics_key\": {\"metrics\": true}}"
    echo "STRATA_DATABASE__URL=$serving_url"
  } > "$old.new"
  mv "$old.new" "$old"
  echo "STRATA_DATABASE__URL=${MIGRATION_DATABASE_URL:-$owner_url}" > "$dir/strata-migration.env"
  echo "token=$metrics_key" > "$dir/strata-metrics.env"
  echo "upgraded the previous release's secrets of $dir (the old strata-secrets.env is strata-secrets.previous.env):" \
    "the migration Job takes its database URL, the pods the serving role's and the Milvus user strata" \
    "(run jobs/milvus-user once), Prometheus a metrics-only key"
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
elif [ "$present" -eq 2 ] && [ -e "$dir/strata-secrets.env" ] && [ -e "$dir/milvus-credentials.env" ]; then
  upgrade_previous
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
