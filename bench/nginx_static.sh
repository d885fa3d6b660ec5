# Sourced by bench/run.sh and bench/capacity.sh: the conf of the reference nginx, serving
# files statically as fast as it can (sendfile, keep-alive without limit, no access log).
#
#   static_nginx_conf WORK PORT ROOT REF_DIR WORKERS > "$WORK/nginx/nginx.conf"
#
# ROOT is served at /, REF_DIR at /ref/; nginx's pid, logs and temp files go under WORK/nginx.
static_nginx_conf() {
  local work="$1" port="$2" root="$3" ref="$4" workers="$5"
  cat <<EOF
user $(id -un);
worker_processes $workers;
pid $work/nginx/nginx.pid;
error_log $work/nginx/error.log warn;
events { worker_connections 1024; }
http {
    sendfile on;
    tcp_nopush on;
    tcp_nodelay on;
    keepalive_requests 1000000;
    access_log off;
    default_type application/octet-stream;
    client_body_temp_path $work/nginx/body;
    proxy_temp_path $work/nginx/proxy;
    fastcgi_temp_path $work/nginx/fastcgi;
    uwsgi_temp_path $work/nginx/uwsgi;
    scgi_temp_path $work/nginx/scgi;
    server {
        listen 127.0.0.1:$port;
        root $root;
        location /ref/ { alias $ref/; }
    }
}
EOF
}
