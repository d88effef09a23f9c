#!/bin/sh
# Writes the two git-ignored files kustomization.yaml's secretGenerator reads, with fresh random secrets:
#   strata-secrets.env       strata's API key, its Milvus token, the PostgreSQL and Redis URLs
#   milvus-credentials.env   MinIO's keys and Milvus's root password
# strata's token is root:<the root password>, so the two cannot disagree. Fill in the PostgreSQL and Redis
# URLs afterwards (or set STRATA_DATABASE__URL / STRATA_REDIS__URL before running). Existing files are kept.
#
#   deploy/k8s/make-secrets.sh [DIR]     # DIR defaults to this script's folder
set -eu
dir=${1:-$(dirname "$0")}
random() { od -An -tx1 -N24 /dev/urandom | tr -d ' \n'; }

for name in strata-secrets.env milvus-credentials.env; do
  if [ -e "$dir/$name" ]; then
    echo "$dir/$name exists: not overwritten (delete it to make new secrets)" >&2
    exit 1
  fi
done

root_password=$(random)
umask 077
cat > "$dir/milvus-credentials.env" <<END
accesskey=strata
secretkey=$(random)
rootpassword=$root_password
END
cat > "$dir/strata-secrets.env" <<END
STRATA_API__API_KEY=$(random)
STRATA_MILVUS__TOKEN=root:$root_password
STRATA_DATABASE__URL=${STRATA_DATABASE__URL:-postgresql+psycopg://strata:CHANGE_ME@postgres.strata.svc:5432/strata}
STRATA_REDIS__URL=${STRATA_REDIS__URL:-redis://:CHANGE_ME@redis.strata.svc:6379/0}
END
echo "wrote $dir/milvus-credentials.env and $dir/strata-secrets.env"
grep -q CHANGE_ME "$dir/strata-secrets.env" && echo "fill in the CHANGE_ME of $dir/strata-secrets.env (PostgreSQL, Redis)"
exit 0
