/*
 * status.c — the status page at `/`: one self-contained HTML+JS page (no external asset, works offline).  The
 * shell shows nothing of the store: it asks for a key once (kept in sessionStorage for the browser session) and
 * then polls GET /v1/batches every second with it, drawing each batch's progress bar, rows ok/failed and status.
 * The numbers are request_counts as the API returns them (so the page and the API agree by construction).
 * Not here yet: the running job's pass-time / tok/s chart, the memory plan and the live tail of rows.
 */
const char serve_status_page[] =
    "<!doctype html><html><head><meta charset=utf-8><title>spill serve</title><style>"
    "body{font:14px system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse}"
    "td,th{padding:4px 10px;text-align:left;border-bottom:1px solid #ddd}"
    ".bar{width:240px;height:12px;background:#eee;position:relative}.ok{background:#3a3;height:12px;float:left}"
    ".bad{background:#c33;height:12px;float:left}</style></head><body><h1>spill serve</h1>"
    "<div id=login><input id=key type=password placeholder='API key'> <button id=go>show batches</button></div>"
    "<p id=msg></p><table id=t hidden><thead><tr><th>batch</th><th>status</th><th>progress</th><th>ok</th>"
    "<th>failed</th><th>total</th><th>ETA</th></tr></thead><tbody id=rows></tbody></table><script>\n"
    "const S=sessionStorage;let first={};\n"
    "function esc(s){return String(s).replace(/[&<>\"']/g,c=>'&#'+c.charCodeAt(0)+';')}\n"
    "async function poll(){const k=S.getItem('spill_key');if(k===null)return;"
    "const r=await fetch('/v1/batches?limit=100',{headers:{Authorization:'Bearer '+k}});"
    "if(r.status==401){S.removeItem('spill_key');document.getElementById('msg').textContent='wrong key';"
    "document.getElementById('login').hidden=false;return}"
    "const j=await r.json();document.getElementById('login').hidden=true;document.getElementById('t').hidden=false;"
    "let h='';const now=Date.now()/1000;for(const b of j.data){const c=b.request_counts,t=c.total||0,"
    "d=c.completed+c.failed;let eta='';if(b.status=='in_progress'&&d>0&&t>d){"
    "const f=first[b.id]||(first[b.id]={t:now,d:d});const rate=(d-f.d)/Math.max(1,now-f.t);"
    "eta=rate>0?Math.round((t-d)/rate)+' s':'';}"
    "const w=x=>t?(240*x/t):0;h+='<tr data-id=\"'+esc(b.id)+'\"><td>'+esc(b.id)+'</td><td>'+esc(b.status)+"
    "'</td><td><div class=bar><div class=ok style=\"width:'+w(c.completed)+'px\"></div><div class=bad "
    "style=\"width:'+w(c.failed)+'px\"></div></div></td><td class=completed>'+c.completed+'</td><td class=failed>'+"
    "c.failed+'</td><td class=total>'+t+'</td><td>'+eta+'</td></tr>'}"
    "document.getElementById('rows').innerHTML=h}\n"
    "document.getElementById('go').onclick=()=>{S.setItem('spill_key',document.getElementById('key').value);poll()};\n"
    "const q=new URLSearchParams(location.hash.slice(1));if(q.get('key'))S.setItem('spill_key',q.get('key'));\n"
    "poll();setInterval(poll,1000);\n"
    "</script></body></html>\n";
