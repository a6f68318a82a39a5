/*
 * status.c — the status page at `/`: one self-contained HTML+JS page (no external asset, works offline).  The
 * shell shows nothing of the store: it asks for a key once (kept in sessionStorage for the browser session) and
 * then polls GET /v1/batches every second with it, drawing each batch's progress bar, rows ok/failed and status.
 * The numbers are request_counts as the API returns them (so the page and the API agree by construction).
 * For an in_progress batch it also fetches GET /v1/batches/{id}/progress (progress.c) and draws the job below the
 * table: the pre-run line, the last pass, the pass-time and tok/s charts, the tail of rows.
 */
/* The job view both pages draw from a progress object (progress.c): the bar, counts, pre-run line, last pass,
 * the two charts (SVG made by spill, inserted as markup: svg.c escapes every text) and the tail (escaped here). */
#define JOB_HTML                                                                                                     \
    "<div class=bar><div id=ok class=ok></div><div id=bad class=bad></div></div>"                                    \
    "<p><b id=counts></b></p><p id=plan></p><p id=last></p><div class=charts id=charts></div>"                       \
    "<h2>last rows</h2><table><thead><tr><th>custom_id</th><th>status</th><th>finish</th><th>text</th></tr></thead>" \
    "<tbody id=tail></tbody></table>"
#define JOB_JS                                                                                                       \
    "function esc(s){return String(s==null?'':s).replace(/[&<>\"']/g,c=>'&#'+c.charCodeAt(0)+';')}\n"               \
    "function drawJob(j){const c=j.counts,t=c.total||0,w=x=>t?(480*x/t):0,$=i=>document.getElementById(i);"       \
    "$('ok').style.width=w(c.completed)+'px';$('bad').style.width=w(c.failed)+'px';"                               \
    "$('counts').textContent=c.completed+' ok, '+c.failed+' failed of '+t+' rows';"                                \
    "$('plan').textContent=j.plan;const l=j.last_pass;"                                                             \
    "$('last').textContent=l?('pass '+j.passes+': '+l.seconds.toFixed(3)+' s, '+Math.round(l.tok_s)+' tok/s, '+"    \
    "l.rows+' rows, '+(l.rss_bytes/1e9).toFixed(2)+' GB resident, '+l.kv_pages+' KV pages'):'no pass yet';"        \
    "$('charts').innerHTML=j.chart_seconds+j.chart_tok_s;let h='';"                                                 \
    "for(const x of j.tail)h+='<tr><td>'+esc(x.custom_id)+'</td><td>'+esc(x.status_code)+'</td><td>'+"              \
    "esc(x.finish_reason)+'</td><td>'+esc(x.text)+'</td></tr>';$('tail').innerHTML=h}\n"
#define JOB_CSS                                                                                                      \
    ".bar{width:480px;height:14px;background:#eee}.ok{background:#3a3;height:14px;float:left}"                       \
    ".bad{background:#c33;height:14px;float:left}.charts svg{width:480px;height:auto;margin-right:1em}"             \
    "#plan{font-family:monospace;white-space:pre-wrap;max-width:70em}"

const char serve_status_page[] =
    "<!doctype html><html><head><meta charset=utf-8><title>spill serve</title><style>"
    "body{font:14px system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse}"
    "td,th{padding:4px 10px;text-align:left;border-bottom:1px solid #ddd}"
    ".bar{width:240px;height:12px;background:#eee;position:relative}.ok{background:#3a3;height:12px;float:left}"
    ".bad{background:#c33;height:12px;float:left}#job .bar{width:480px}" JOB_CSS "</style></head><body><h1>spill serve</h1>"
    "<div id=login><input id=key type=password placeholder='API key'> <button id=go>show batches</button></div>"
    "<p id=msg></p><table id=t hidden><thead><tr><th>batch</th><th>status</th><th>progress</th><th>ok</th>"
    "<th>failed</th><th>total</th><th>ETA</th></tr></thead><tbody id=rows></tbody></table>"
    "<div id=job hidden><h2 id=jobid></h2>" JOB_HTML "</div><script>\n"
    "const S=sessionStorage;let first={};\n" JOB_JS
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
    "document.getElementById('rows').innerHTML=h;const run=j.data.find(b=>b.status=='in_progress');"
    "document.getElementById('job').hidden=!run;if(run){"
    "const p=await fetch('/v1/batches/'+encodeURIComponent(run.id)+'/progress',{headers:{Authorization:'Bearer '+k}});"
    "if(p.ok){document.getElementById('jobid').textContent='running: '+run.id;drawJob(await p.json())}}}\n"
    "document.getElementById('go').onclick=()=>{S.setItem('spill_key',document.getElementById('key').value);poll()};\n"
    "const q=new URLSearchParams(location.hash.slice(1));if(q.get('key'))S.setItem('spill_key',q.get('key'));\n"
    "poll();setInterval(poll,1000);\n"
    "</script></body></html>\n";

/* The page of one job: `spill run --status-port N` (progress.c).  The key comes in the URL's fragment (never sent
 * to the server, kept in sessionStorage); every second it fetches /progress and draws the job view. */
const char serve_job_page[] =
    "<!doctype html><html><head><meta charset=utf-8><title>spill run</title><style>"
    "body{font:14px system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse}"
    "td,th{padding:4px 10px;text-align:left;border-bottom:1px solid #ddd;vertical-align:top}" JOB_CSS
    "</style></head><body><h1>spill run</h1>"
    "<p id=msg>Open the URL the run printed (it carries the key).</p><div id=job hidden>" JOB_HTML "</div><script>\n"
    "const S=sessionStorage;const q=new URLSearchParams(location.hash.slice(1));"
    "if(q.get('key')){S.setItem('spill_run_key',q.get('key'));history.replaceState(null,'',location.pathname)}\n" JOB_JS
    "async function poll(){const k=S.getItem('spill_run_key');if(k===null)return;let r;"
    "try{r=await fetch('/progress',{headers:{Authorization:'Bearer '+k}})}catch(e){"
    "document.getElementById('msg').hidden=false;"
    "document.getElementById('msg').textContent='the run has ended (no answer from it)';return}"
    "if(r.status==401){document.getElementById('msg').textContent='wrong key: open the URL the run printed';return}"
    "document.getElementById('msg').hidden=true;document.getElementById('job').hidden=false;drawJob(await r.json())}\n"
    "poll();setInterval(poll,1000);\n"
    "</script></body></html>\n";
